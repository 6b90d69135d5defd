"""The prefill tier in a stats round and in the status (pure): the endpoints of the
ready prefill pods that every decode worker is told with ``PUT /prefillers`` (there is no
DNS or kube-proxy to find them by; docs/podrunner.md), whether a worker needs telling,
and ``status.prefill``. The I/O is ``statsloop`` (the round) and ``reconcile`` (the
StatefulSet mirror); the names and labels are :mod:`genpool_operator.tiers`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from genpool_core.names import WORKER_PORT
from genpool_operator.round_plan import Event, PushOutcome
from genpool_operator.spec_sections import Prefill

PREFILLERS_PUSH_FAILED = "PrefillersPushFailed"


def endpoint(ip: str, port: int = WORKER_PORT) -> str:
    """``ip:port`` as a worker's ``--prefillers`` takes it (an IPv6 address bracketed)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def prefill_endpoints(ips: Iterable[str]) -> tuple[str, ...]:
    """The ready prefill pods' endpoints, sorted: one order, whatever the list order."""
    return tuple(sorted(endpoint(ip) for ip in ips))


def needs_push(reported: Sequence[str] | None, endpoints: Sequence[str]) -> bool:
    """A decode worker needs ``PUT /prefillers`` when it reports another set (order aside:
    it round-robins over them) or could not say (None: unreadable, or an older worker)."""
    return reported is None or sorted(reported) != sorted(endpoints)


def parse_endpoints(body: object) -> list[str] | None:
    """``GET /prefillers``'s ``{"endpoints": [...]}``, or None when it is not that."""
    found = body.get("endpoints") if isinstance(body, Mapping) else None
    if not isinstance(found, list) or not all(isinstance(e, str) for e in found):
        return None
    return list(found)


@dataclass(frozen=True, slots=True)
class PrefillRound:
    """What a stats round told the decode workers: the endpoints and the push's outcome."""

    endpoints: tuple[str, ...]
    push: PushOutcome

    def to_status(self) -> dict[str, Any]:
        """``status.prefill``'s round fields (merged beside the StatefulSet's counts)."""
        push = self.push
        return {
            "endpoints": list(self.endpoints),
            "decodeInSync": f"{push.num_in_sync}/{push.num_targets}",
        }

    def events(self) -> list[Event]:
        if not self.push.errors:
            return []
        return [Event("Warning", PREFILLERS_PUSH_FAILED, self.push.errors_text()[:1000])]


@dataclass(frozen=True, slots=True)
class PrefillCounts:
    """The prefill StatefulSet's counts (``desired``: its ``spec.replicas``)."""

    desired: int
    replicas: int = 0
    ready: int = 0

    @classmethod
    def from_statefulset(cls, statefulset: Mapping[str, Any]) -> PrefillCounts:
        counts = statefulset.get("status") or {}
        return cls(
            desired=int((statefulset.get("spec") or {}).get("replicas") or 0),
            replicas=int(counts.get("replicas") or 0),
            ready=int(counts.get("readyReplicas") or 0),
        )

    def to_status(self) -> dict[str, Any]:
        return {
            "desired": self.desired,
            "replicas": self.replicas,
            "readyReplicas": self.ready,
            "ready": f"{self.ready}/{self.desired}",  # the Prefill column
        }


def mirror_patch(
    status: Mapping[str, Any], counts: PrefillCounts, *, has_prefill: bool
) -> dict[str, Any] | None:
    """The status patch of a prefill StatefulSet's change: its counts into
    ``status.prefill`` (a merge patch keeps the round's fields), or, once ``spec.prefill``
    is gone (the StatefulSet is being deleted), ``status.prefill`` dropped; None: no news."""
    recorded = status.get("prefill")
    if not has_prefill:
        return {"prefill": None} if recorded is not None else None
    current = recorded if isinstance(recorded, Mapping) else {}
    merged = {**current, **counts.to_status()}
    return None if merged == current else {"prefill": counts.to_status()}


def spec_patch(status: Mapping[str, Any], prefill: Prefill | None) -> dict[str, Any]:
    """What a reconcile records of the tier (``spec.prefill``): its start counts until the
    StatefulSet reports, or ``status.prefill`` dropped when the tier is gone."""
    recorded = status.get("prefill")
    if prefill is None:
        return {"prefill": None} if recorded is not None else {}
    if isinstance(recorded, Mapping) and "desired" in recorded:
        return {}
    return {"prefill": PrefillCounts(prefill.replicas).to_status()}
