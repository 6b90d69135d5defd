"""The reconcile loop: one pod informer feeding the binder and one worker thread per pod."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

import httpx

from .binder import Binder
from .containers import Backoff
from .env import node_allocatable
from .informer import PodInformer
from .kube import ApiError, Kube, Obj, load_kubeconfig, pod_path
from .kubelet_api import KubeletServer
from .node import Node
from .podenv import MARK_STATE, Context, base_env
from .sandbox import IpPool
from .worker import PodWorker

log = logging.getLogger(__name__)
TERMINAL = ("Succeeded", "Failed")


class Runner:
    def __init__(
        self,
        kubeconfig: Path,
        state_dir: Path,
        node_name: str,
        kubelet_port: int = 0,
        backoff: Backoff | None = None,
        pass_env: list[str] | None = None,
        schedule: bool = True,
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        creds = load_kubeconfig(kubeconfig, self.state_dir / "secrets")
        self.kube = Kube(creds)
        alloc = node_allocatable()
        self.ctx = Context(
            self.kube,
            creds,
            node_name,
            self.state_dir,
            IpPool(),
            backoff or Backoff(),
            base_env(pass_env or []),
            alloc,
        )
        self.node = Node(self.kube, node_name, alloc, self.ctx.host_ip)
        self.binder = Binder(self.kube, node_name, self.node.labels)
        self.kubelet = KubeletServer(kubelet_port, self.state_dir / "pki", self.logs)
        self.schedule = schedule
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.workers: dict[str, PodWorker] = {}
        self.finished: set[str] = set()  # uids this runner is done with (deleted or terminal)

    def run(self) -> None:
        """Serve until `stop` is set; then kill every pod process and return."""
        kill_orphans(self.state_dir)
        self.kubelet.start()
        self._register()
        log.info(
            "node %s ready; kubelet API on 127.0.0.1:%d", self.ctx.node_name, self.kubelet.port
        )
        threading.Thread(
            target=self.node.heartbeat, args=(self.stop,), daemon=True, name="heartbeat"
        ).start()
        informer = PodInformer(self.kube, self.handle, self.stop)
        threading.Thread(
            target=informer.run, args=(self.binder.retry_failed,), daemon=True, name="informer"
        ).start()
        self.stop.wait()
        self.shutdown()

    def _register(self) -> None:
        """Register the node, retrying while the apiserver is still coming up."""
        while not self.stop.is_set():
            try:
                self.node.register(self.kubelet.port)
                return
            except (ApiError, httpx.HTTPError) as err:
                log.warning("registering node %s: %s; retrying", self.ctx.node_name, err)
                self.stop.wait(2.0)

    def shutdown(self) -> None:
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.halt()
        deadline = time.monotonic() + 5.0
        for w in workers:
            w.join(timeout=max(deadline - time.monotonic(), 0.1))
        try:
            self.node.report(ready=False)
        except Exception as err:  # the apiserver may already be gone
            log.info("could not mark the node NotReady: %s", err)
        self.kubelet.shutdown()
        log.info("pod runner stopped")

    def handle(self, kind: str, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        if not spec.get("nodeName"):
            if not self.schedule:
                return
            if kind == "DELETED":
                self.binder.forget(uid)
            else:
                self.binder.offer(pod)
            return
        if spec["nodeName"] != self.ctx.node_name:
            return
        with self.lock:
            worker = self.workers.get(uid)
            if kind == "DELETED":
                self.finished.discard(uid)
                if worker:
                    worker.gone()
                return
            if worker:
                worker.update(pod)
                return
            done = uid in self.finished or (pod.get("status") or {}).get("phase") in TERMINAL
            if done and meta.get("deletionTimestamp"):
                self._delete_now(pod)
            elif not done and not self.stop.is_set():
                worker = PodWorker(self.ctx, pod, self._worker_done)
                self.workers[uid] = worker
                worker.start()

    def _worker_done(self, uid: str) -> None:
        with self.lock:
            self.workers.pop(uid, None)
            self.finished.add(uid)

    def _delete_now(self, pod: Obj) -> None:
        """A pod with no processes left (terminal, or already stopped): finish its deletion."""
        meta = pod["metadata"]
        if (meta.get("deletionGracePeriodSeconds") or 0) == 0 and meta.get("finalizers"):
            return  # already at grace 0, waiting only for someone else's finalizers
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        try:
            self.kube.delete(pod_path(meta["namespace"], meta["name"]), body)
        except ApiError as err:
            if err.status not in (404, 409):
                log.warning("deleting %s: %s", meta["name"], err)

    def logs(self, namespace: str, pod: str, container: str) -> tuple[list[Path], bool] | None:
        """For the kubelet API: a live pod's logs, else the newest pod dir of that name on disk."""
        with self.lock:
            live = [w for w in self.workers.values() if w.name == f"{namespace}/{pod}"]
        if live:
            return live[0].log_files(container)
        dirs = sorted(
            (self.state_dir / "pods").glob(f"{namespace}_{pod}_*/logs/{container}"),
            key=lambda d: d.stat().st_mtime,
        )
        if not dirs:
            return None
        return sorted(dirs[-1].glob("*.log"), key=lambda p: int(p.stem)), False


def kill_orphans(state_dir: Path) -> None:
    """Processes a previous runner of this state dir left behind (it was SIGKILLed)."""
    mark = f"{MARK_STATE}={state_dir}".encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark not in (entry / "environ").read_bytes():
                continue
            os.killpg(os.getpgid(int(entry.name)), signal.SIGKILL)
            log.info("killed orphaned pod process %s", entry.name)
        except (OSError, ValueError):
            continue
