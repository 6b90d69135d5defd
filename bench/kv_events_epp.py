"""The epp side of bench/kv_events_interop.py: llm-d's endpoint picker's configuration for
precise prefix-cache routing over two workers, and the reads that tell the driver the
picker has taken in every KV event batch the workers sent (its metrics and its log)."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

HOSTS = ("127.0.0.1", "127.0.0.2")
NAMES = ("worker-a", "worker-b")
EPP_METRIC = "llm_d_epp_kv_cache_events_"
SENT = "genpool_kv_event_batches_total"
SYNC_TIMEOUT_S = 30.0
POLL_S = 0.05


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
    """File discovery, the vLLM-render token producer, the precise prefix-cache producer
    subscribing to every endpoint's PUB socket (and its replay socket), its scorer."""
    events = {
        "topicFilter": "kv@",
        "discoverPods": True,
        "podDiscoveryConfig": {"socketPort": zmq_port, "replaySocketPort": replay_port},
    }
    plugins = [
        {"name": "file-discovery", "type": "file-discovery",
         "parameters": {"path": str(endpoints), "watchFile": False}},
        {"type": "token-producer", "parameters": {"modelName": model, "vllm": {"url": render_url}}},
        {"type": "endpoint-notification-source"},
        {"type": "precise-prefix-cache-producer", "parameters": {
            "tokenProcessorConfig": {"blockSizeTokens": block_size}, "kvEventsConfig": events}},
        {"type": "prefix-cache-scorer",
         "parameters": {"prefixMatchInfoProducerName": "precise-prefix-cache-producer"}},
        {"type": "max-score-picker"},
        {"type": "single-profile-handler"},
    ]  # fmt: skip
    profile = [{"pluginRef": "prefix-cache-scorer", "weight": 1},
               {"pluginRef": "max-score-picker"}]  # fmt: skip
    source = {"pluginRef": "endpoint-notification-source",
              "extractors": [{"pluginRef": "precise-prefix-cache-producer"}]}  # fmt: skip
    return json.dumps({
        "apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": profile}],
        "dataLayer": {"injectDefaults": False, "discovery": {"pluginRef": "file-discovery"},
                      "sources": [source]},
    })  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    """A Prometheus text page as ``name{labels}`` -> value."""
    text = httpx.get(url, timeout=10).text
    return {m[1]: float(m[2]) for m in re.finditer(r"^([^#\s]\S*) (\S+)$", text, re.MULTILINE)}


def total(page: dict[str, float], name: str, *labels: str) -> float:
    """The sum of ``name``'s series whose labels hold every one of ``labels``."""
    return sum(v for k, v in page.items()
               if k.startswith(name + "{") and all(label in k for label in labels))  # fmt: skip


def sent_counts(worker_urls: Sequence[str]) -> dict[str, float]:
    """KV event batches each worker sent (its ``genpool_kv_event_batches_total``)."""
    return {name: total(scrape(f"{url}/metrics"), SENT, 'outcome="sent"')
            for name, url in zip(NAMES, worker_urls, strict=True)}  # fmt: skip


class EppWatch:
    """Whether the epp has every batch the workers sent: live ones by its
    ``messages_received`` counter per pod, replayed ones by its log's "Replay complete"
    lines; processed once its event queue is empty."""

    def __init__(self, metrics_url: str, worker_urls: list[str], log_path: Path) -> None:
        self.metrics_url, self.worker_urls, self.log_path = metrics_url, worker_urls, log_path
        self.unseen = dict.fromkeys(NAMES, 0.0)  # sent before the live subscription

    def sent(self) -> dict[str, float]:
        return sent_counts(self.worker_urls)

    def received(self) -> tuple[dict[str, float], float]:
        """Live batches the epp received from each worker, and its queue's depth."""
        page = scrape(self.metrics_url)
        live = {name: total(page, f"{EPP_METRIC}messages_received_total", f'/{name}"')
                for name in NAMES}  # fmt: skip
        return live, page.get(f"{EPP_METRIC}pool_queue_depth", 0.0)

    def replayed(self) -> dict[str, int]:
        """Batches each worker's replay socket gave the epp (its last run's log lines)."""
        text = self.log_path.read_text(errors="replace").rsplit("\n==== ", 1)[-1]
        found: dict[str, int] = {}
        for line in text.splitlines():
            if '"Replay complete"' in line:
                record = json.loads(line)
                host = record["replayEndpoint"].removeprefix("tcp://").rsplit(":", 1)[0]
                found[NAMES[HOSTS.index(host)]] = int(record["replayed"])
        return found

    def wait_for_replay(self, sent: dict[str, float]) -> dict[str, int]:
        """Until the epp replayed each worker's batches from 0 (all ``sent``)."""
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while (got := self.replayed()) != {n: int(s) for n, s in sent.items()}:
            if time.monotonic() > deadline:
                raise SystemExit(f"the epp replayed {got}, not the {sent} batches sent")
            time.sleep(POLL_S)
        return got

    def join(self, probe: Sequence[Callable[[], object]]) -> None:
        """Until the live subscription to each worker delivers: ``probe[k]()`` sends
        worker k a request with a new prompt (a batch), until the epp counts one."""
        deadline = time.monotonic() + 60
        for k, name in enumerate(NAMES):
            while self.received()[0][name] == 0:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the epp never received {name}'s KV events live")
                probe[k]()
                time.sleep(4 * POLL_S)  # the probe's batch to arrive, then read again
        received = self.received()[0]
        self.unseen = {n: s - received[n] for n, s in self.sent().items()}
        self.sync()

    def sync(self) -> None:
        """Until the epp received every batch sent since it joined and its queue is
        empty, twice in a row (a batch is counted just before it is queued)."""
        deadline, calm = time.monotonic() + SYNC_TIMEOUT_S, 0
        while calm < 2:
            received, depth = self.received()
            sent = self.sent()
            caught_up = all(received[n] + self.unseen[n] >= sent[n] for n in NAMES)
            calm = calm + 1 if caught_up and depth == 0 else 0
            if time.monotonic() > deadline:
                raise SystemExit(f"the epp did not catch up: sent {sent}, got {received}")
            time.sleep(POLL_S)
