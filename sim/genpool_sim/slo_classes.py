"""Request classes with their own SLOs (``--classes``): parse, assign, measure.

``interactive:0.3:tpot_ms=50,batch:0.7:tpot_ms=400`` is 30 % of requests held to an
output-rate floor T_i = 1000 / 50 = 20 tokens/s, 70 % to 2.5 tokens/s. ``ttft_ms``
gives a class its own GEN admission target D_i too. A class without ``tpot_ms`` is
held to the pool's T. Shares must add up to 1.

Pure and seeded: a request's class is drawn from its own ``random.Random``, so adding
classes does not change the arrivals or lengths a seed draws.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from genpool_core.quantiles import percentile
from genpool_sim.records import SimRequest

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_KEYS = ("tpot_ms", "ttft_ms")
SHARE_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class SloClass:
    name: str
    share: float
    tpot_ms: float | None = None
    ttft_ms: float | None = None

    @property
    def target_output_tps(self) -> float | None:
        """T_i = 1000 / tpot_ms, tokens/s (``None``: the pool's T)."""
        return None if self.tpot_ms is None else 1000.0 / self.tpot_ms

    @property
    def slo_ttft_s(self) -> float | None:
        """D_i, seconds (``None``: the pool's adaptive X)."""
        return None if self.ttft_ms is None else self.ttft_ms / 1000.0


def parse_classes(text: str) -> list[SloClass]:
    """``NAME:SHARE[:tpot_ms=MS][:ttft_ms=MS],...``; ``ValueError`` names the bad item."""
    classes: list[SloClass] = []
    for index, item in enumerate(text.split(","), start=1):
        classes.append(_parse_class(index, item.strip()))
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ValueError(f"class names must differ, got {', '.join(names)}")
    total = sum(c.share for c in classes)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        raise ValueError(f"shares must add up to 1, got {total:g}")
    return classes


def _parse_class(index: int, item: str) -> SloClass:
    name, *fields = item.split(":")
    where = f"class {index} {item!r}"
    if not _NAME.fullmatch(name) or not fields:
        raise ValueError(f"{where}: expected NAME:SHARE[:tpot_ms=MS][:ttft_ms=MS]")
    share = _number(where, "SHARE", fields[0])
    if not 0.0 < share <= 1.0:
        raise ValueError(f"{where}: SHARE must be in (0, 1], got {fields[0]}")
    values: dict[str, float] = {}
    for field in fields[1:]:
        key, sep, value = field.partition("=")
        if not sep or key not in _KEYS:
            raise ValueError(f"{where}: unknown field {field!r}; use {' or '.join(_KEYS)}")
        if key in values:
            raise ValueError(f"{where}: {key} given twice")
        values[key] = _number(where, key, value)
        if values[key] <= 0.0:
            raise ValueError(f"{where}: {key} must be > 0, got {value}")
    return SloClass(name, share, values.get("tpot_ms"), values.get("ttft_ms"))


def _number(where: str, what: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: {what} must be finite, got {text}")
    return value


class ClassPicker:
    """Draws each request's class by share, from a stream of its own per seed."""

    def __init__(self, classes: Sequence[SloClass], seed: int) -> None:
        self._classes = list(classes)
        self._weights = [c.share for c in classes]
        self._rng = random.Random(f"genpool-sim-classes:{seed}")

    def assign(self, request: SimRequest, *, carries_slo: bool) -> None:
        """Label ``request``; with ``carries_slo`` it also carries the class's D_i and T_i
        to the GEN worker (otherwise the pool sees one T for everyone)."""
        chosen = self._rng.choices(self._classes, self._weights)[0]
        request.slo_class = chosen.name
        if carries_slo:
            request.target_output_tps = chosen.target_output_tps
            request.slo_ttft_s = chosen.slo_ttft_s


def class_metrics(
    done: Sequence[SimRequest], classes: Sequence[SloClass], pool_tps: float | None
) -> dict[str, float]:
    """Per class ``class.NAME.*``: requests, ``below_target`` (output rate under the
    class's floor, else the pool's T), ``ttft_p90`` and, with ``ttft_ms``,
    ``wait_over_target`` (GEN admission wait above D_i); ``class_below_target`` over all."""
    metrics: dict[str, float] = {}
    num_rated = num_below = 0
    for slo_class in classes:
        members = [r for r in done if r.slo_class == slo_class.name and r.ttft is not None]
        ttfts = [t for r in members if (t := r.ttft) is not None]
        prefix = f"class.{slo_class.name}."
        metrics[prefix + "requests"] = float(len(members))
        metrics[prefix + "ttft_p90"] = percentile(ttfts, 90)
        floor = slo_class.target_output_tps or pool_tps
        rates = [rate for r in members if (rate := r.output_rate) is not None]
        if floor is not None and rates:
            below = sum(1 for rate in rates if rate < floor)
            metrics[prefix + "below_target"] = below / len(rates)
            num_rated, num_below = num_rated + len(rates), num_below + below
        if slo_class.slo_ttft_s is not None:
            waits = [w for r in members if (w := r.admission_wait) is not None]
            over = sum(1 for wait in waits if wait > slo_class.slo_ttft_s)
            metrics[prefix + "wait_over_target"] = over / len(waits) if waits else math.nan
    if num_rated:
        metrics["class_below_target"] = num_below / num_rated
    return metrics
