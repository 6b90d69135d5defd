"""One thread per pod on this node: sandbox, containers in order, probes, status, termination."""

from __future__ import annotations

import logging
import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from genpool_core.termination import TERMINATION_LOG_ENV

from . import podstatus
from .containers import Container
from .env import EnvError, expand_argv
from .kube import ApiError, pod_path
from .lifecycle import Lifecycle
from .podenv import Context, container_env
from .probes import Target, run_handler
from .process import Proc, StartError, api_time
from .sandbox import ApiAccess, PodDir, materialize_volumes
from .termination import fresh_message_file

log = logging.getLogger(__name__)
Obj = dict[str, Any]
TICK_S = 0.3
RETRY_S = 2.0


class PodWorker(Lifecycle, threading.Thread):
    def __init__(self, ctx: Context, pod: Obj, on_exit: Callable[[str], None]) -> None:
        meta = pod["metadata"]
        super().__init__(daemon=True, name=f"pod:{meta['namespace']}/{meta['name']}")
        self.ctx, self.pod, self.uid, self.on_exit = ctx, pod, meta["uid"], on_exit
        self.wake = threading.Event()
        self.deleted = self.halting = self.terminating = self.initialized = False
        self.pdir = PodDir(ctx.state_dir, pod)
        self.ip = ""
        self.sandbox_at = 0.0  # when to (re)try the sandbox; -1 once it is ready
        self.volumes: dict[str, Path] = {}
        self.api: ApiAccess | None = None
        status = pod.get("status") or {}
        self.start_time = status.get("startTime") or api_time()
        self.inits = [Container(c, init=True) for c in pod["spec"].get("initContainers") or []]
        self.mains = [Container(c) for c in pod["spec"]["containers"]]
        self._adopt(status)
        self.sent: Obj | None = None
        self.my_conditions: list[Obj] = []

    # ---- runner interface ----------------------------------------------------------------

    def update(self, pod: Obj) -> None:
        self.pod = pod
        self.wake.set()

    def gone(self) -> None:
        self.deleted = True
        self.wake.set()

    def halt(self) -> None:
        self.halting = True
        self.wake.set()

    def containers(self) -> list[Container]:
        return self.inits + self.mains

    # ---- loop --------------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self._tick_safely():
                self.wake.wait(TICK_S)
                self.wake.clear()
        finally:
            self._kill_all(grace_s=3.0 if self.halting else 2.0)
            self.ctx.ips.release(self.uid)
            self.on_exit(self.uid)

    def _tick_safely(self) -> bool:
        try:
            return self._tick()
        except ApiError as err:
            if err.status == 404:
                log.info("%s: pod is gone", self.name)
                return True
            log.warning("%s: %s", self.name, err)
        except (httpx.HTTPError, OSError) as err:
            log.warning("%s: %s", self.name, err)
        except Exception:
            log.exception("%s: unexpected error", self.name)
        self.wake.wait(1.0)
        return False

    def _tick(self) -> bool:
        """One pass; True when this worker is done with the pod."""
        if self.halting:
            return True
        if self.deleted:
            self._kill_all(grace_s=2.0)
            self.pdir.cleanup()
            return True
        if self.pod["metadata"].get("deletionTimestamp"):
            return self._terminate()
        if self.sandbox_at >= 0 and not self._setup():
            self._report()
            return False
        if self.api:
            self.api.refresh_if_due()
        self._collect_exits(deleting=False)
        self._start_due()
        self._probe()
        ph = self._report()
        return ph in ("Succeeded", "Failed") and not any(c.running for c in self.containers())

    # ---- sandbox and starts --------------------------------------------------------------

    def _setup(self) -> bool:
        if time.monotonic() < self.sandbox_at:
            return False
        try:
            self.ip = self.ip or self.ctx.ips.claim(
                self.uid, (self.pod.get("status") or {}).get("podIP", "")
            )
            self.pdir.create()
            self.volumes = materialize_volumes(self.pod, self.pdir, self.ctx.kube)
            if ApiAccess.wanted(self.pod):
                self.api = ApiAccess(self.ctx.kube, self.ctx.creds, self.pod, self.pdir)
                self.api.refresh_if_due()
        except (ApiError, httpx.HTTPError, OSError, RuntimeError) as err:
            log.warning("%s: sandbox not ready: %s", self.name, err)
            for c in self.containers():
                c.waiting("ContainerCreating", f"pod sandbox not ready: {err}")
            self.sandbox_at = time.monotonic() + RETRY_S
            return False
        self.sandbox_at = -1.0
        return True

    def _start_due(self) -> None:
        for c in self.inits:
            if c.done and c.exit_code != 0:
                return  # a failed init container fails the pod (restartPolicy Never)
            if c.done:
                continue
            if not c.running:
                self._maybe_start(c)
            if self.initialized or (c.sidecar and c.running and c.started):
                continue
            return
        self.initialized = True
        for c in self.mains:
            if not c.running and not c.done:
                self._maybe_start(c)

    def _maybe_start(self, c: Container) -> None:
        if time.monotonic() < c.next_start_at:
            return
        policy = self.pod["spec"].get("restartPolicy") or "Always"
        try:
            env, service = self._env(c.spec)
        except (EnvError, ApiError, httpx.HTTPError) as err:
            c.waiting("CreateContainerConfigError", str(err))
            c.next_start_at = time.monotonic() + RETRY_S
            return
        argv = expand_argv(c.spec, service)
        workdir = Path(c.spec.get("workingDir") or self.pdir.work)
        cwd = workdir if workdir.is_dir() else self.pdir.work
        run_index = c.restart_count + (1 if c.ever_ran else 0)
        c.message_file = None
        if c.spec.get("terminationMessagePath"):
            c.message_file = fresh_message_file(self.pdir.message_dir(c.name), run_index)
            env[TERMINATION_LOG_ENV] = str(c.message_file)
        try:
            if not argv:
                raise StartError(
                    "no command: images are not pulled, so the pod runner needs command"
                )
            proc = Proc(argv, env, cwd, self.pdir.log_dir(c.name) / f"{run_index}.log")
        except StartError as err:
            log.warning("%s: container %s cannot run: %s", self.name, c.name, err)
            c.start_failed(str(err), policy, self.ctx.backoff)
            return
        c.begin(proc, Target(self.ip, c.spec, env, cwd))
        log.info("%s: started %s (pid %d): %.200s", self.name, c.name, proc.pid, shlex.join(argv))
        self._post_start(c)

    def _post_start(self, c: Container) -> None:
        hook = (c.spec.get("lifecycle") or {}).get("postStart")
        if hook and c.target and c.proc:
            ok, msg = run_handler(hook, c.target, timeout=30.0)
            if not ok:
                log.warning("%s: postStart of %s failed: %s", self.name, c.name, msg)
                c.proc.kill_now()

    def _env(self, spec: Obj) -> tuple[dict[str, str], dict[str, str]]:
        view = {**self.pod, "status": {**(self.pod.get("status") or {}), **self._ips()}}
        kubeconfig = self.pdir.kubeconfig if self.api else None
        return container_env(self.ctx, view, spec, self.pdir, self.volumes, kubeconfig)

    def _ips(self) -> Obj:
        host = self.ctx.host_ip
        out: Obj = {"hostIP": host, "hostIPs": [{"ip": host}]}
        if self.ip:
            out.update(podIP=self.ip, podIPs=[{"ip": self.ip}])
        return out

    # ---- status --------------------------------------------------------------------------

    def _report(self) -> str:
        policy = self.pod["spec"].get("restartPolicy") or "Always"
        ph = podstatus.phase(self.inits, self.mains, policy)
        server = (self.pod.get("status") or {}).get("conditions") or []
        mine = {c["type"] for c in self.my_conditions}
        old = [c for c in server if c["type"] not in mine] + self.my_conditions
        gates = [g["conditionType"] for g in self.pod["spec"].get("readinessGates") or []]
        conds = podstatus.conditions(old, self.inits, self.mains, ph, self.sandbox_at < 0, gates)
        status: Obj = {
            "phase": ph,
            "startTime": self.start_time,
            "conditions": conds,
            **self._ips(),
        }
        status["containerStatuses"] = [c.status() for c in self.mains]
        if self.inits:
            status["initContainerStatuses"] = [c.status() for c in self.inits]
        if status != self.sent:
            meta = self.pod["metadata"]
            self.ctx.kube.merge_patch(
                pod_path(meta["namespace"], meta["name"], "status"), {"status": status}
            )
            self.sent = status
            self.my_conditions = [c for c in conds if c["type"] in podstatus.OURS]
        return ph

    def _adopt(self, status: Obj) -> None:
        for group, key in (
            (self.inits, "initContainerStatuses"),
            (self.mains, "containerStatuses"),
        ):
            old = {s["name"]: s for s in status.get(key) or []}
            for c in group:
                if c.name in old:
                    c.adopt(old[c.name])

    @property  # Thread.name is settable; a pod worker is named by its pod, read-only
    def name(self) -> str:  # type: ignore[override]
        meta = self.pod["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    def log_files(self, container: str) -> tuple[list[Path], bool]:
        """This container's run logs, oldest first, and whether the newest is still written."""
        c = next((c for c in self.containers() if c.name == container), None)
        files = sorted(self.pdir.log_dir(container).glob("*.log"), key=lambda p: int(p.stem))
        return files, bool(c and c.proc and c.proc.log_open)
