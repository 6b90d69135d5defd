"""Probing, restarts on probe failure, and graceful termination: a mixin of PodWorker.

Kept apart from the worker's start-up path so each reads on its own; the attributes used here
(`pod`, `ctx`, `pdir`, `uid`, `name`, `containers()`, `_report()`) are PodWorker's.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .containers import Container
from .kube import ApiError, pod_path
from .probes import run_handler

if TYPE_CHECKING:
    from .podenv import Context
    from .sandbox import PodDir

log = logging.getLogger(__name__)
Obj = dict[str, Any]


class Lifecycle:
    if TYPE_CHECKING:  # PodWorker's, declared for the type checker only
        pod: Obj
        ctx: Context
        pdir: PodDir
        uid: str
        terminating: bool

        @property
        def name(self) -> str: ...
        def containers(self) -> list[Container]: ...
        def _report(self) -> str: ...

    def _probe(self) -> None:
        now = time.monotonic()
        for c in self.containers():
            if not c.proc or c.proc.stopping or not c.target:
                continue
            startup = c.probes.get("startup")
            if startup and not c.started:
                if startup.due(now) and startup.run(c.target) is not None:
                    if startup.result:
                        c.started = True
                    else:
                        self._kill_for_restart(c, f"startup probe failed: {startup.message}")
                continue
            ready = c.probes.get("readiness")
            if ready and ready.due(now):
                ready.run(c.target)
            c.ready = ready.result is True if ready else True
            live = c.probes.get("liveness")
            if live and live.due(now) and live.run(c.target) is False:
                self._kill_for_restart(c, f"liveness probe failed: {live.message}")

    def _kill_for_restart(self, c: Container, why: str) -> None:
        assert c.proc is not None
        log.info("%s: container %s %s, will be restarted", self.name, c.name, why)
        c.ready = False
        probe = c.probes.get("liveness") or c.probes.get("startup")
        grace = (
            probe.spec.get("terminationGracePeriodSeconds") if probe else None
        ) or self._grace()
        c.proc.stop_async(float(grace), self._pre_stop(c))

    def _collect_exits(self, deleting: bool) -> None:
        policy = self.pod["spec"].get("restartPolicy") or "Always"
        for c in self.containers():
            code = c.proc.poll() if c.proc else None
            if code is not None:
                log.info("%s: container %s exited with %d", self.name, c.name, code)
                c.finished(c.exit_term(code), policy, self.ctx.backoff, deleting)

    def _grace(self) -> float:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        value = meta.get("deletionGracePeriodSeconds")
        if value is None:
            value = spec.get("terminationGracePeriodSeconds")
        return float(30 if value is None else value)

    def _pre_stop(self, c: Container) -> Callable[[float], None] | None:
        hook = (c.spec.get("lifecycle") or {}).get("preStop")
        target = c.target
        if not hook or target is None:
            return None

        def run(timeout: float) -> None:
            ok, msg = run_handler(hook, target, timeout)
            log.log(
                logging.INFO if ok else logging.WARNING,
                "%s: preStop of %s: %s",
                self.name,
                c.name,
                "ok" if ok else msg,
            )

        return run

    def _terminate(self) -> bool:
        """Graceful delete: preStop, SIGTERM, SIGKILL at the deadline, then remove the pod."""
        if not self.terminating:
            self.terminating = True
            grace = self._grace()
            log.info("%s: deleting, grace %gs", self.name, grace)
            for c in self.containers():
                if c.proc:  # (a liveness kill already in flight keeps its own deadline)
                    c.proc.stop_async(grace, self._pre_stop(c))
        self._collect_exits(deleting=True)
        if any(c.running for c in self.containers()):
            return False
        self._report()
        meta = self.pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
        try:
            self.ctx.kube.delete(pod_path(meta["namespace"], meta["name"]), body)
        except ApiError as err:
            if err.status not in (404, 409):
                raise
        self.pdir.cleanup()
        log.info("%s: deleted", self.name)
        return True

    def _kill_all(self, grace_s: float) -> None:
        procs = [c.proc for c in self.containers() if c.proc]
        for p in procs:
            p.signal(signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in procs:
            p.kill_now()
            p.poll()
