"""List + watch of pods with a local cache, so handlers see every change exactly like a relist.

After a 410 Gone (events expired) or a broken stream the cache is rebuilt from a fresh list and
pods that vanished meanwhile are reported as DELETED: a missed delete must still stop processes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import httpx

from .kube import ApiError, Kube, Obj

log = logging.getLogger(__name__)
Handler = Callable[[str, Obj], None]  # ("ADDED"|"MODIFIED"|"DELETED"|"SYNC", pod)


class PodInformer:
    def __init__(self, kube: Kube, handler: Handler, stop: threading.Event) -> None:
        self.kube = kube
        self.handler = handler
        self.stop = stop
        self.cache: dict[str, Obj] = {}  # uid -> pod
        self.rv = ""

    def relist(self) -> None:
        doc = self.kube.get("/api/v1/pods")
        self.rv = doc["metadata"]["resourceVersion"]
        fresh = {p["metadata"]["uid"]: p for p in doc.get("items", [])}
        for uid, pod in list(self.cache.items()):
            if uid not in fresh:
                self._emit("DELETED", pod)
        for pod in fresh.values():
            self._emit("SYNC", pod)

    def run(self, on_tick: Callable[[], None]) -> None:
        """Relist, then watch until `stop`; `on_tick` runs between watch requests."""
        need_list = True
        while not self.stop.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                self._watch_once()
            except ApiError as err:
                need_list = True
                if err.status != 410:
                    log.warning("pod watch: %s", err)
                    self.stop.wait(1.0)
            except (httpx.HTTPError, OSError, ValueError) as err:
                need_list = True
                log.warning("pod watch broke (%s); relisting", err)
                self.stop.wait(1.0)
            on_tick()

    def _watch_once(self) -> None:
        started = time.monotonic()
        for event in self.kube.watch("/api/v1/pods", {"resourceVersion": self.rv}, timeout_s=10):
            if self.stop.is_set():
                return
            kind, obj = event["type"], event["object"]
            if kind == "ERROR":
                raise ApiError(int(obj.get("code") or 500), str(obj.get("message")))
            self.rv = obj["metadata"].get("resourceVersion") or self.rv
            if kind != "BOOKMARK":
                self._emit(kind, obj)
            if time.monotonic() - started > 5.0:
                return  # give on_tick (binding retries) a chance on busy clusters too

    def _emit(self, kind: str, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            self.cache.pop(uid, None)
        else:
            self.cache[uid] = pod
        try:
            self.handler(kind, pod)
        except Exception:
            log.exception("handling %s of pod %s", kind, pod["metadata"].get("name"))
