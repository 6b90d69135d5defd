"""Per-container bookkeeping: current run, probes, restart policy with back-off, status."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .probes import Probe, Target
from .process import Proc, api_time, exit_reason
from .termination import termination_message

Obj = dict[str, Any]
STABLE_RUN_S = 60.0  # a run this long resets the crash back-off
LOG_DRAIN_S = 2.0  # how long an exit waits for the run's last log lines (the fallback message)


@dataclass
class Backoff:
    initial: float = 1.0
    maximum: float = 60.0


@dataclass
class Container:
    spec: Obj
    init: bool = False
    restart_count: int = 0
    proc: Proc | None = None
    target: Target | None = None
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    ready: bool = False
    started: bool = False
    done: bool = False  # terminated and will not run again
    ever_ran: bool = False
    next_start_at: float = 0.0
    crashes: int = 0
    run_began: float = 0.0
    probes: dict[str, Probe] = field(default_factory=dict)
    message_file: Path | None = None  # this run's termination-message file

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def sidecar(self) -> bool:
        """A restartable init container (KEP-753): started in order, then runs alongside."""
        return self.init and self.spec.get("restartPolicy") == "Always"

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def exit_code(self) -> int | None:
        term = self.state.get("terminated")
        return None if term is None else int(term["exitCode"])

    def begin(self, proc: Proc, target: Target) -> None:
        if self.ever_ran:
            self.restart_count += 1
        self.proc, self.target, self.ever_ran = proc, target, True
        self.run_began = time.monotonic()
        self.state = {"running": {"startedAt": proc.started_at}}
        self.ready = False
        self.started = "startupProbe" not in self.spec
        self.probes = {
            kind: Probe(kind, self.spec[key], self.run_began)
            for kind, key in (
                ("startup", "startupProbe"),
                ("readiness", "readinessProbe"),
                ("liveness", "livenessProbe"),
            )
            if key in self.spec
        }

    def waiting(self, reason: str, message: str = "") -> None:
        self.state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}

    def finished(self, term: Obj, policy: str, backoff: Backoff, deleting: bool) -> None:
        """Record an exit (or a failed start) and decide whether the container runs again."""
        self.proc, self.ready, self.started = None, False, False
        failed = term["exitCode"] != 0
        if self.init and not self.sidecar:
            again = failed and policy != "Never"
        elif self.sidecar:
            again = True
        else:
            again = policy == "Always" or (policy == "OnFailure" and failed)
        if deleting or not again:
            self.state, self.done = {"terminated": term}, True
            return
        if self.run_began and time.monotonic() - self.run_began > STABLE_RUN_S:
            self.crashes = 0
        delay = (
            0.0
            if self.crashes == 0
            else min(backoff.maximum, backoff.initial * 2 ** (self.crashes - 1))
        )
        self.crashes += 1
        self.next_start_at = time.monotonic() + delay
        self.last_state = {"terminated": term}
        self.ever_ran = True
        self.waiting(
            "CrashLoopBackOff", f"back-off {delay:g}s restarting failed container={self.name}"
        )

    def exit_term(self, code: int) -> Obj:
        assert self.proc is not None
        term: Obj = {
            "exitCode": code,
            "reason": exit_reason(code),
            "startedAt": self.proc.started_at,
            "finishedAt": self.proc.finished_at or api_time(),
            "containerID": f"process://{self.proc.pid}",
        }
        if code != 0:
            self.proc.pump.join(LOG_DRAIN_S)  # the log's tail may be the message
        message = termination_message(self.spec, self.message_file, self.proc.pump.path, code)
        if message:
            term["message"] = message
        return term

    def start_failed(self, message: str, policy: str, backoff: Backoff) -> None:
        """A start that never produced a process counts as a (failed) run, as in the kubelet."""
        if self.ever_ran:
            self.restart_count += 1
        self.finished(self.start_error_term(message), policy, backoff, deleting=False)

    @staticmethod
    def start_error_term(message: str) -> Obj:
        stamp = api_time()
        return {
            "exitCode": 128,
            "reason": "ContainerCannotRun",
            "message": message,
            "startedAt": stamp,
            "finishedAt": stamp,
        }

    def status(self) -> Obj:
        image = self.spec.get("image") or ""
        entry: Obj = {
            "name": self.name,
            "image": image,
            "imageID": f"process://{self.proc.exe}" if self.proc else "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.proc:
            entry["containerID"] = f"process://{self.proc.pid}"
        elif "terminated" in self.state and "containerID" in self.state["terminated"]:
            entry["containerID"] = self.state["terminated"]["containerID"]
        return entry

    def adopt(self, old: Obj) -> None:
        """Continue a status written before the runner restarted (its process died with it)."""
        self.restart_count = int(old.get("restartCount", 0))
        state = old.get("state") or {}
        if "running" in state or old.get("lastState"):
            self.ever_ran = True
            self.last_state = old.get("lastState") or {}
        if "running" in state:
            self.last_state = {
                "terminated": {
                    "exitCode": 255,
                    "reason": "Unknown",
                    "startedAt": state["running"].get("startedAt"),
                    "finishedAt": api_time(),
                }
            }
        if (
            "terminated" in state
            and self.init
            and not self.sidecar
            and state["terminated"].get("exitCode") == 0
        ):
            self.state, self.done = state, True  # a finished init container does not run again
