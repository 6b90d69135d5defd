"""Pod phase and conditions from the containers' states, following the kubelet's rules."""

from __future__ import annotations

from typing import Any

from .containers import Container
from .process import api_time

Obj = dict[str, Any]
OURS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled")


def phase(inits: list[Container], mains: list[Container], policy: str) -> str:
    """The kubelet's getPhase: Pending until every container ran once, terminal once none will."""
    failed_init = any(c.done and c.exit_code not in (None, 0) for c in inits if not c.sidecar)
    if failed_init:
        return "Failed"
    if not all(c.done or (c.sidecar and c.ever_ran) for c in inits):
        return "Pending"
    waiting = sum(1 for c in mains if not c.running and not c.done and not c.last_state)
    running = sum(1 for c in mains if c.running)
    stopped = [c for c in mains if not c.running and (c.done or c.last_state)]
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if not all(c.done for c in stopped):
        return "Running"  # in back-off, about to restart
    return "Succeeded" if all(c.exit_code == 0 for c in stopped) else "Failed"


def conditions(
    old: list[Obj],
    inits: list[Container],
    mains: list[Container],
    phase_: str,
    sandbox: bool,
    gates: list[str],
) -> list[Obj]:
    """Our conditions (lastTransitionTime kept while the status holds) plus foreign ones."""
    before = {c["type"]: c for c in old}
    terminal = phase_ in ("Succeeded", "Failed")
    not_init = [c.name for c in inits if not (c.done or (c.sidecar and c.ever_ran))]
    unready = [c.name for c in mains if not c.ready] + [
        c.name for c in inits if c.sidecar and not c.ready
    ]
    gates_open = all(before.get(g, {}).get("status") == "True" for g in gates)
    ready_reason = (
        "PodCompleted"
        if terminal
        else ("ContainersNotReady" if unready else "ReadinessGatesNotReady")
    )
    want = [
        ("PodScheduled", True, "", ""),
        ("PodReadyToStartContainers", sandbox and not terminal, "", ""),
        (
            "Initialized",
            not not_init or terminal,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(not_init)}]",
        ),
        (
            "ContainersReady",
            not unready and not terminal,
            ready_reason,
            f"containers with unready status: [{' '.join(unready)}]",
        ),
        (
            "Ready",
            not unready and gates_open and not terminal,
            ready_reason,
            f"containers with unready status: [{' '.join(unready)}]",
        ),
    ]
    out = [c for c in old if c["type"] not in OURS]
    for kind, ok, reason, message in want:
        out.append(_condition(before.get(kind), kind, ok, reason, message))
    return out


def _condition(prev: Obj | None, kind: str, ok: bool, reason: str, message: str) -> Obj:
    status = "True" if ok else "False"
    cond: Obj = {"type": kind, "status": status}
    if prev and prev.get("status") == status:
        cond["lastTransitionTime"] = prev.get("lastTransitionTime") or api_time()
    else:
        cond["lastTransitionTime"] = api_time()
    cond["lastProbeTime"] = None
    if not ok and reason:
        cond["reason"], cond["message"] = reason, message
    return cond
