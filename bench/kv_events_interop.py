"""llm-d's precise prefix-cache routing over GenPool workers (docs/operator.md, "Precise
prefix-cache routing with llm-d"): llm-d's unmodified endpoint picker (epp), built from
llm-d/llm-d-router outside this repository, over two ``genpool-worker`` processes on
127.0.0.1 and 127.0.0.2 that publish KV events (``--kv-events-config``).

    python -m bench.kv_events_interop --epp /path/to/epp [--model synthetic:interop]

The epp runs without Kubernetes (its file-discovery data layer), dials each worker's PUB
socket and replay socket (per-pod subscription), tokenizes through the first worker's
``/v1/completions/render`` and ``/v1/chat/completions/render``, and scores with the
``precise-prefix-cache-producer`` and ``prefix-cache-scorer`` pair; the driver asks it
for each request's pick over ext_proc as Envoy would (``EppClient``) and sends the
request there. The load is multi-turn conversations, half over completions and half over
chat: turn k is turn k-1 with its reply and a new question. Before each pick the driver
waits until the epp has every batch the workers sent (``EppWatch``), as a user's think
time would. The load, the epp's configuration, ``EppWatch`` and the conversation loop
are genpool_devcluster.interop's (``conversations``, ``prefix_epp``), shared with the
same check on the devcluster (``python -m genpool_devcluster.interop precise-prefix``).
Three runs:

``events``   KV events on, the epp up from the start (live events);
``replay``   KV events on, every conversation's first turn served (round robin) before
             the epp starts: it learns them from the workers' replay sockets alone;
``control``  KV events off: the same picker, nothing to score.

Writes ``bench/results/kv_events_interop.json``: commit, command, each run's summary and
every turn (pick, previous pick, scores, cached tokens). Not in ``make test``: it needs
the epp binary (docs/operator.md gives the build).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from bench.kv_events_epp import HOSTS, NAMES, endpoints_file, epp_config, shared_free_port
from genpool_devcluster.interop.children import Proc, epp_proc, running
from genpool_devcluster.interop.common import LOG_DIR, http_ok, log
from genpool_devcluster.interop.conversations import (
    Conversation,
    Turn,
    as_rows,
    summarise,
    turn_record,
)
from genpool_devcluster.interop.prefix_epp import (
    EPP_METRIC,
    EppWatch,
    converse,
    probe_request,
    provenance,
    scrape,
    send,
    sent_counts,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "kv_events_interop.json"
MODES = ("events", "replay", "control")


def worker_proc(name: str, host: str, args: argparse.Namespace, ports: dict[str, int],
                events: bool) -> Proc:  # fmt: skip
    argv = [sys.executable, "-m", "genpool_worker.worker_cli", "--model", args.model,
            "--host", host, "--port", str(ports["http"]),
            "--kv-block-size", str(args.block_size)]  # fmt: skip
    if events:
        flag = {"enable_kv_cache_events": True, "publisher": "zmq",
                "endpoint": f"tcp://*:{ports['zmq']}",
                "replay_endpoint": f"tcp://*:{ports['replay']}",
                "topic": f"kv@{host}:{ports['http']}@{args.model}"}  # fmt: skip
        argv += ["--kv-events-config", json.dumps(flag)]
    return Proc(f"{name}-{'events' if events else 'control'}", argv)


class Setup:
    """The two workers, then (``start_epp``) the epp over them."""

    def __init__(self, stack: ExitStack, args: argparse.Namespace, events: bool) -> None:
        self.stack, self.args, self.events = stack, args, events
        self.ports = {k: shared_free_port() for k in ("http", "zmq", "replay")}
        self.urls = [f"http://{host}:{self.ports['http']}" for host in HOSTS]
        self.workers = dict(zip(NAMES, self.urls, strict=True))
        for name, host, url in zip(NAMES, HOSTS, self.urls, strict=True):
            proc = worker_proc(name, host, args, self.ports, events)
            stack.enter_context(running(proc, partial(http_ok, f"{url}/ready"), name, 300))
        self.epp_address = ""
        self.watch: EppWatch | None = None

    def start_epp(self) -> EppWatch:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        endpoints = endpoints_file(LOG_DIR / "kv-events-endpoints.yaml", self.ports["http"])
        config = epp_config(endpoints, self.args.model, self.urls[0], self.args.block_size,
                            self.ports["zmq"], self.ports["replay"])  # fmt: skip
        epp, grpc_port, metrics_port = epp_proc(
            self.args.epp.parent, config, pool="kv-events", namespace="default",
            kubeconfig=None, extra=("--emit-endpoint-scores",), binary=self.args.epp)  # fmt: skip
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        self.stack.enter_context(running(epp, partial(http_ok, metrics), "the epp", 120))
        self.epp_address = f"127.0.0.1:{grpc_port}"
        self.watch = EppWatch(metrics, self.workers, epp.log_path)
        return self.watch

    def probe(self, k: int) -> None:
        """A request to worker ``k`` whose prompt is new (its blocks: one batch)."""
        probe_request(self.urls[k], self.args.model)

    def sync(self) -> None:
        if self.events and self.watch is not None:
            self.watch.sync()


async def first_turns_direct(setup: Setup, conversations: list[Conversation]) -> list[Turn]:
    """Every conversation's first turn, sent round robin with no epp (the replay run)."""
    turns = []
    async with httpx.AsyncClient(timeout=120) as http:
        for conv in conversations:
            raw = json.dumps(conv.body(0, setup.args.model, setup.args.max_tokens)).encode()
            endpoint = setup.urls[conv.index % len(HOSTS)].removeprefix("http://")
            reply = await send(http, endpoint, conv, raw)
            reply.raise_for_status()
            turns.append(turn_record(conv, 1, endpoint, None, {}, reply.json()))
            conv.answered(reply.json())
    return turns


def one_run(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    log(f"run {mode}")
    conversations = [Conversation(c, "chat" if c % 2 else "completions")
                     for c in range(args.conversations)]  # fmt: skip
    with ExitStack() as stack:
        setup = Setup(stack, args, events=mode != "control")
        done = asyncio.run(first_turns_direct(setup, conversations)) if mode == "replay" else []
        sent_before = sent_counts(setup.workers) if mode == "replay" else {}
        watch = setup.start_epp()
        replayed = watch.wait_for_replay(sent_before) if mode == "replay" else {}
        if setup.events:
            watch.join([partial(setup.probe, k) for k in range(len(HOSTS))])
        turns = asyncio.run(converse(setup.epp_address, conversations, done,
                                     model=args.model, max_tokens=args.max_tokens,
                                     turns=args.turns, sync=setup.sync))  # fmt: skip
        page = scrape(watch.metrics_url)
    errors = {k: v for k, v in page.items() if k.startswith(f"{EPP_METRIC}zmq_errors_total")}
    return {"mode": mode, "kv_events": setup.events, "replayed_batches": replayed,
            "summary": summarise(turns, args.block_size), "epp_zmq_errors": errors,
            "turns": as_rows(turns)}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.kv_events_interop",
                                     description=(__doc__ or "").split("\n\n")[0])  # fmt: skip
    parser.add_argument("--epp", type=Path, required=True, help="llm-d-router's epp binary")
    parser.add_argument(
        "--epp-source-commit",
        default=None,
        help="the llm-d-router commit the epp was built from (recorded)",
    )
    parser.add_argument(
        "--model",
        default="synthetic:interop",
        help="synthetic:<name>, smollm2-135m, or a checkpoint",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="the workers' --kv-block-size, the epp's blockSizeTokens",
    )
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument(
        "--runs", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(given)
    modes = [m for m in args.runs.split(",") if m]
    if not args.epp.is_file():
        parser.error(f"--epp {args.epp}: no such file")
    if not modes or set(modes) - set(MODES):
        parser.error(f"--runs {args.runs}: each of {', '.join(MODES)}")
    if args.conversations < 1 or args.turns < 2:
        parser.error("at least one conversation of two turns")
    command = "python -m bench.kv_events_interop " + " ".join(given)
    result = provenance(args, command) | {"runs": [one_run(args, mode) for mode in modes]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for run in result["runs"]:
        log(f"{run['mode']}: {run['summary']}")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
