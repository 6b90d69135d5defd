"""The file-discovery side of bench/kv_events_interop.py: two workers on 127.0.0.1 and
127.0.0.2 sharing one port set, and the epp's endpoints file and configuration for them
(the configuration, the sync with the epp and the conversation loop are shared with the
devcluster run: genpool_devcluster.interop.prefix_epp)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from genpool_devcluster.interop.prefix_epp import precise_prefix_config

HOSTS = ("127.0.0.1", "127.0.0.2")
NAMES = ("worker-a", "worker-b")


def shared_free_port() -> int:
    """A TCP port free on every address of ``HOSTS`` (the epp dials one port per pod)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((HOSTS[0], 0))
            port = int(probe.getsockname()[1])
        try:
            for host in HOSTS[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise SystemExit(f"no port free on all of {HOSTS}")


def endpoints_file(path: Path, http_port: int) -> Path:
    """The file-discovery endpoints (JSON, which is YAML): one per worker."""
    entries = [{"name": n, "address": h, "port": str(http_port)}
               for n, h in zip(NAMES, HOSTS, strict=True)]  # fmt: skip
    path.write_text(json.dumps({"endpoints": entries}))
    return path


def epp_config(endpoints: Path, model: str, render_url: str, block_size: int,
               zmq_port: int, replay_port: int) -> str:  # fmt: skip
    """File discovery of ``endpoints``, per-pod subscription with replay."""
    discovery = {"name": "file-discovery", "type": "file-discovery",
                 "parameters": {"path": str(endpoints), "watchFile": False}}  # fmt: skip
    return precise_prefix_config(model, render_url, block_size, zmq_port,
                                 replay_port=replay_port, discovery=discovery)  # fmt: skip
