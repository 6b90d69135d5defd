"""llm-d's epp for precise prefix-cache routing, shared by ``precise-prefix`` (the
devcluster: Kubernetes discovery of the GenPool's InferencePool) and
bench/kv_events_interop.py (two loopback workers: file discovery): the picker's
configuration, the reads that tell the driver the epp has taken in every KV event batch
the workers sent (its metrics, its log), and the conversations' turns, each picked by the
epp over ext_proc and sent where it says."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from genpool_devcluster import checkout
from genpool_devcluster.interop.common import log
from genpool_devcluster.interop.conversations import Conversation, Turn, turn_record
from genpool_devcluster.interop.epp_client import EppClient

EPP_METRIC = "llm_d_epp_kv_cache_events_"
SENT = "genpool_kv_event_batches_total"
SYNC_TIMEOUT_S = 30.0
POLL_S = 0.05


def precise_prefix_config(model: str, render_url: str, block_size: int, zmq_port: int, *,
                          replay_port: int | None = None,
                          discovery: dict[str, Any] | None = None) -> str:  # fmt: skip
    """The vLLM-render token producer (``render_url``: a worker), the precise prefix-cache
    producer subscribing to every endpoint's PUB socket on ``zmq_port`` (and its replay
    socket), its scorer, a max-score picker. ``discovery``: a discovery plugin (file
    discovery); None: the epp's own, the InferencePool's pods in Kubernetes. No metrics
    source (``injectDefaults: false``): nothing but the prefix scorer weighs in."""
    pod_discovery: dict[str, Any] = {"socketPort": zmq_port}
    if replay_port is not None:
        pod_discovery["replaySocketPort"] = replay_port
    events = {"topicFilter": "kv@", "discoverPods": True, "podDiscoveryConfig": pod_discovery}
    plugins = [
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
    data_layer: dict[str, Any] = {"injectDefaults": False, "sources": [source]}
    if discovery is not None:
        plugins.insert(0, discovery)
        data_layer["discovery"] = {"pluginRef": discovery["name"]}
    return json.dumps({
        "apiVersion": "llm-d.ai/v1alpha1", "kind": "EndpointPickerConfig", "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": profile}], "dataLayer": data_layer,
    })  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    """A Prometheus text page as ``name{labels}`` -> value."""
    text = httpx.get(url, timeout=10).text
    return {m[1]: float(m[2]) for m in re.finditer(r"^([^#\s]\S*) (\S+)$", text, re.MULTILINE)}


def total(page: Mapping[str, float], name: str, *labels: str) -> float:
    """The sum of ``name``'s series whose labels hold every one of ``labels``."""
    return sum(v for k, v in page.items()
               if k.startswith(name + "{") and all(label in k for label in labels))  # fmt: skip


def sent_counts(workers: Mapping[str, str]) -> dict[str, float]:
    """KV event batches each worker (name -> base URL) sent: its
    ``genpool_kv_event_batches_total{outcome="sent"}``."""
    return {name: total(scrape(f"{url}/metrics"), SENT, 'outcome="sent"')
            for name, url in workers.items()}  # fmt: skip


def last_run(log_text: str) -> str:
    """The log of the process's last start (``children.Proc`` heads each with ``====``)."""
    return log_text.rsplit("\n==== ", 1)[-1]


def subscribed_endpoints(log_path: Path) -> set[str]:
    """The endpoints (``<namespace>/<name>``) the precise prefix-cache producer added a
    KV events subscriber for in the epp's last run: the pods it discovered (its debug log,
    ``--v=4``)."""
    found = set()
    for line in last_run(log_path.read_text(errors="replace")).splitlines():
        if '"Adding subscriber"' in line:
            found.add(str(json.loads(line)["endpoint"]))
    return found


class EppWatch:
    """Whether the epp has every batch the workers sent: live ones by its
    ``messages_received`` counter per endpoint, replayed ones by its log's "Replay
    complete" lines; processed once its event queue is empty. ``workers``: the epp's name
    of each endpoint (its metrics' label ends ``/<name>``; ``<pod>-rank-0`` in Kubernetes)
    -> that worker's base URL."""

    def __init__(self, metrics_url: str, workers: Mapping[str, str], log_path: Path) -> None:
        self.metrics_url, self.workers, self.log_path = metrics_url, dict(workers), log_path
        self.unseen = dict.fromkeys(self.workers, 0.0)  # sent before the live subscription

    def sent(self) -> dict[str, float]:
        return sent_counts(self.workers)

    def received(self) -> tuple[dict[str, float], float]:
        """Live batches the epp received from each worker, and its queue's depth."""
        page = scrape(self.metrics_url)
        live = {name: total(page, f"{EPP_METRIC}messages_received_total", f'/{name}"')
                for name in self.workers}  # fmt: skip
        return live, page.get(f"{EPP_METRIC}pool_queue_depth", 0.0)

    def replayed(self) -> dict[str, int]:
        """Batches each worker's replay socket gave the epp (its last run's log lines)."""
        by_host = {urlsplit(url).hostname: name for name, url in self.workers.items()}
        text = last_run(self.log_path.read_text(errors="replace"))
        found: dict[str, int] = {}
        for line in text.splitlines():
            if '"Replay complete"' in line:
                record = json.loads(line)
                host = record["replayEndpoint"].removeprefix("tcp://").rsplit(":", 1)[0]
                found[by_host[host]] = int(record["replayed"])
        return found

    def wait_for_replay(self, sent: Mapping[str, float]) -> dict[str, int]:
        """Until the epp replayed each worker's batches from 0 (all ``sent``)."""
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while (got := self.replayed()) != {n: int(s) for n, s in sent.items()}:
            if time.monotonic() > deadline:
                raise SystemExit(f"the epp replayed {got}, not the {dict(sent)} batches sent")
            time.sleep(POLL_S)
        return got

    def join(self, probe: Sequence[Callable[[], object]]) -> None:
        """Until the live subscription to each worker delivers: ``probe[k]()`` sends the
        k-th worker a request with a new prompt (a batch), until the epp counts one."""
        deadline = time.monotonic() + 60
        for k, name in enumerate(self.workers):
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
            caught_up = all(received[n] + self.unseen[n] >= sent[n] for n in self.workers)
            calm = calm + 1 if caught_up and depth == 0 else 0
            if time.monotonic() > deadline:
                raise SystemExit(f"the epp did not catch up: sent {sent}, got {received}")
            time.sleep(POLL_S)


def probe_request(url: str, model: str) -> None:
    """A request to the worker at ``url`` whose prompt is new (its blocks: one batch)."""
    body = {"model": model, "max_tokens": 1,
            "prompt": f"probe {url} {time.monotonic_ns()}: are the KV events live?"}  # fmt: skip
    httpx.post(f"{url}/v1/completions", json=body, timeout=60).raise_for_status()


async def send(http: httpx.AsyncClient, endpoint: str, conv: Conversation,
               raw: bytes) -> httpx.Response:  # fmt: skip
    headers = {"content-type": "application/json"}
    return await http.post(f"http://{endpoint}{conv.path}", content=raw, headers=headers)


async def converse(epp_address: str, conversations: list[Conversation], done: list[Turn], *,
                   model: str, max_tokens: int, turns: int,
                   sync: Callable[[], None]) -> list[Turn]:  # fmt: skip
    """The conversations' remaining turns (``done``: those already served) in lockstep:
    each picked by the epp over ext_proc as Envoy would ask, sent there, the reply passed
    back through the epp; ``sync()`` after each (in a thread: it polls)."""
    out = list(done)
    previous = {t.conversation: t.picked for t in done}
    async with EppClient(epp_address) as epp, httpx.AsyncClient(timeout=120) as http:
        for turn in range(len(done) // len(conversations), turns):
            for conv in conversations:
                raw = json.dumps(conv.body(turn, model, max_tokens)).encode()
                pick = await epp.pick(conv.path, raw, "gateway")
                reply = await send(http, pick.endpoint, conv, raw)
                await epp.finish(pick, reply.status_code, [("content-type",
                                 "application/json")], reply.content)  # fmt: skip
                reply.raise_for_status()
                record = turn_record(conv, turn + 1, pick.endpoint, previous.get(conv.index),
                                     pick.scores, reply.json())  # fmt: skip
                out.append(record)
                previous[conv.index] = pick.endpoint
                conv.answered(reply.json())
                await asyncio.to_thread(sync)
                log(
                    f"conversation {conv.index} ({conv.route}) turn {turn + 1}: {pick.endpoint}"
                    f" scores {pick.scores} cached {record.cached_tokens}/{record.prompt_tokens}"
                )
    return out


def provenance(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """What a result file records of its run: this checkout's commit (and whether it had
    changes), the command, the epp binary (``args.epp``) and the load's shape."""

    return {
        "commit": checkout.commit(),
        "dirty": checkout.is_dirty(),
        "command": command,
        "epp": {"sha256": hashlib.sha256(args.epp.read_bytes()).hexdigest(),
                "source_commit": args.epp_source_commit},
        "model": args.model, "block_size": args.block_size,
        "conversations": args.conversations, "turns": args.turns, "max_tokens": args.max_tokens,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
