"""The spec as the operator accepts it (pure): the CRD's rules (``spec.py``) plus what
the apiserver cannot know, a known model's tensor-parallel limits
(``genpool_core.model_catalogue``) and whether the KV budget derived from a CPU memory
limit holds one request of maxSeqLen (``genpool_operator.kv_budget``), on each tier."""

from __future__ import annotations

from typing import Any

from genpool_core.model_catalogue import tensor_parallel_problem
from genpool_operator.spec import GenPoolSpec, GenPoolSpecError


def checked_spec(raw: dict[str, Any] | None) -> GenPoolSpec:
    """The valid spec; GenPoolSpecError (a ValueError) naming the field otherwise."""
    spec = GenPoolSpec.from_body(raw)
    problem = tensor_parallel_problem(spec.model, spec.tensor_parallel_size)
    if problem is not None:
        raise GenPoolSpecError(problem)
    spec.kv_budget()  # GenPoolSpecError naming resources.limits.memory and maxSeqLen
    _check_prefill_budget(spec)
    return spec


def _check_prefill_budget(spec: GenPoolSpec) -> None:
    """The prefill tier's KV budget, from its own resources (or the GEN tier's)."""
    tier = spec.prefill_tier()
    if tier is None or spec.prefill is None:
        return
    try:
        tier.kv_budget()
    except GenPoolSpecError as exc:
        where = "spec.resources" if spec.prefill.resources is None else "spec.prefill.resources"
        raise GenPoolSpecError(f"the prefill tier (its resources: {where}): {exc}") from None


def spec_error(raw: dict[str, Any] | None) -> str | None:
    """What ``Degraded=True/InvalidSpec`` says about ``raw``, or None when it is valid."""
    try:
        checked_spec(raw)
    except GenPoolSpecError as exc:
        return invalid_spec_message(exc)
    return None


def invalid_spec_message(exc: GenPoolSpecError) -> str:
    return f"invalid spec: {exc}"
