"""What the worker fuzz throws at a worker (bench/fuzz.py, tests/worker/test_fuzz.py), and
how it counts the answers.

Two sources, both seeded and bounded in count:

- schemathesis against the worker's own ``GET /openapi.json``: every operation, cases
  that follow its schema (positive) and cases that break it (negative);
- hypothesis strategies for what the schema does not describe: completion and chat bodies
  whose numbers sit on and past every bound (huge, tiny, negative, too long for a float),
  the headers a router or client may send (``x-genpool-arrival-time``,
  ``x-prefiller-host-port``, llm-d's SLO headers) and ``kv_transfer_params`` handles
  with any field changed.

Every answer must be a 2xx or a 4xx; a 5xx is a finding, and so is an engine death (the
worker's ``/health`` checked after each case). A fuzzed worker never contacts another
address: it knows no prefill workers, and a header or handle naming one is not followed
(docs/operations.md#threat-model), which ``Tally.check_alive`` confirms through the
worker's untrusted-endpoint counter staying the only fallback.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import errors as hypothesis_errors
from hypothesis import strategies as st
from schemathesis.core.result import Ok

MAX_FINDINGS = 20  # 5xx answers kept with their request, for the report
CASE_TIMEOUT_S = 30.0
ADMIN_PATHS = ("/config", "/drain", "/prefillers")  # the fuzz sends no token: 401s


@dataclass
class Tally:
    """Cases run and what came back."""

    url: str
    cases: int = 0
    by_class: Counter[str] = field(default_factory=Counter)
    by_status: Counter[int] = field(default_factory=Counter)
    findings: list[dict[str, Any]] = field(default_factory=list)
    engine_deaths: int = 0
    transport_errors: int = 0

    def record(self, source: str, request: str, status: int | None, text: str = "") -> None:
        self.cases += 1
        if status is None:
            self.transport_errors += 1
            self._finding(source, request, "no answer", text)
        else:
            self.by_status[status] += 1
            self.by_class[f"{status // 100}xx"] += 1
            if status >= 500:
                self._finding(source, request, str(status), text)
        self.check_alive(source, request)

    def _finding(self, source: str, request: str, what: str, text: str) -> None:
        if len(self.findings) < MAX_FINDINGS:
            self.findings.append({"source": source, "request": request[:600],
                                  "answer": what, "text": text[:300]})  # fmt: skip

    def check_alive(self, source: str, request: str) -> None:
        """The engine still runs after the case (its death is what the fuzz must never see)."""
        try:
            is_alive = httpx.get(self.url + "/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            is_alive = False
        if not is_alive:
            self.engine_deaths += 1
            self._finding(source, request, "engine died", "")
            raise EngineDied(request)

    def summary(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "by_class": dict(sorted(self.by_class.items())),
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "num_5xx": sum(v for k, v in self.by_status.items() if k >= 500),
            "engine_deaths": self.engine_deaths,
            "transport_errors": self.transport_errors,
            "findings": self.findings,
        }


class EngineDied(Exception):
    """The worker's engine stopped during the fuzz: the run ends there."""


def _settings(num_cases: int) -> settings:
    return settings(max_examples=num_cases, database=None, deadline=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                    print_blob=False)  # fmt: skip


def run_openapi(tally: Tally, cases_per_operation: int, seed_value: int) -> None:
    """schemathesis: each operation of the worker's schema, positive and negative cases."""
    schema = schemathesis.openapi.from_url(tally.url + "/openapi.json")
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):  # an operation the schema cannot describe: a finding
            tally.record("openapi", f"invalid operation: {result}", None, "")
            continue
        operation = result.ok()
        for mode in schemathesis.GenerationMode:
            try:
                _run_operation(tally, operation, mode, cases_per_operation, seed_value)
            except hypothesis_errors.Unsatisfiable:
                continue  # no negative case exists for an operation that takes nothing


def _run_operation(tally: Tally, operation: Any, mode: schemathesis.GenerationMode,
                   num_cases: int, seed_value: int) -> None:  # fmt: skip
    source = f"openapi/{mode.value}"

    @seed(seed_value)
    @_settings(num_cases)
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        label = f"{case.method} {case.formatted_path} {_body_text(case)}"
        try:
            response = case.call(base_url=tally.url, timeout=CASE_TIMEOUT_S)
        except Exception as exc:  # a transport error is a finding, not a crash
            tally.record(source, label, None, repr(exc))
            return
        status = response.status_code
        tally.record(source, label, status, response.text[:300] if status >= 500 else "")

    one()


def _body_text(case: Any) -> str:
    body = getattr(case, "body", None)
    try:
        return json.dumps(body)[:400]
    except (TypeError, ValueError):
        return repr(body)[:400]


# Numbers on and past every bound a body field has (docs/worker.md#http-api).
EDGE_INTS = st.sampled_from([
    -1, 0, 1, 2, 16, 17, 2**31 - 1, 2**31, 2**53, 2**63 - 1, 2**63, 2**64, 10**400,
]) | st.integers()  # fmt: skip
EDGE_FLOATS = st.sampled_from([
    0.0, 1e-300, 1e-39, 1e-6, 1e-5, 0.5, 1.0, 2.0, 2.0000001, 10.0, 1e38, 1e300, -1e-300, -2.0,
]) | st.floats(allow_nan=False, allow_infinity=False)  # fmt: skip
NUMBER = EDGE_INTS | EDGE_FLOATS
NUMERIC_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "n", "seed", "max_tokens",
                  "max_completion_tokens", "min_tokens", "logprobs", "top_logprobs")  # fmt: skip
TOKEN_IDS = st.lists(EDGE_INTS, min_size=0, max_size=6)
TEXT = st.text(max_size=40)


def _prompt() -> st.SearchStrategy[Any]:
    return st.one_of(TEXT, TOKEN_IDS, st.lists(TEXT, max_size=3), st.lists(TOKEN_IDS, max_size=3))


def _handle() -> st.SearchStrategy[dict[str, Any]]:
    """A handle of the synthetic model's layout with any of its fields changed."""
    layout = {"model": "synthetic:fuzz", "dtype": "int32", "block_size": 16, "num_layers": 1,
              "num_kv_heads": 1, "head_dim": 1, "tensor_parallel_size": 1}  # fmt: skip
    base = {"version": 1, "transfer_id": "0" * 32, "host": "127.0.0.1", "port": 9,
            "layout": layout, "num_prompt_tokens": 1, "prompt_digest": "0" * 64,
            "num_blocks": 1, "num_bytes": 128, "first_token": 32, "age_s": 0.1,
            "first_token_age_s": 0.0, "queue_s": 0.0, "prefill_s": 0.0,
            "expires_in_s": 30.0}  # fmt: skip
    value = st.one_of(NUMBER, TEXT, st.none(), st.booleans(), st.just(layout))
    changed = st.dictionaries(st.sampled_from(sorted(base)), value, max_size=3)
    handle = changed.map(lambda update: base | update)
    genpool = st.one_of(handle, st.lists(handle, min_size=1, max_size=3))
    return st.fixed_dictionaries({"do_remote_prefill": st.just(True), "genpool": genpool})


def _kv_params() -> st.SearchStrategy[Any]:
    leg = st.just({"do_remote_decode": True, "do_remote_prefill": False})
    return st.one_of(st.none(), leg, _handle(), st.dictionaries(TEXT, NUMBER, max_size=2))


def body_strategy() -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """(path, body): completions or chat, each numeric field maybe on or past its bound."""
    numbers = st.dictionaries(st.sampled_from(NUMERIC_FIELDS), NUMBER, max_size=4)
    extras = st.fixed_dictionaries({}, optional={
        "stop_token_ids": TOKEN_IDS, "stop": st.one_of(TEXT, st.lists(TEXT, max_size=5)),
        "stream": st.booleans(), "stream_options": st.fixed_dictionaries(
            {"include_usage": st.booleans()}),
        "genpool": st.dictionaries(st.sampled_from(["arrival_time", "first_token_time", "keyed"]),
                                   st.one_of(NUMBER, st.booleans()), max_size=2),
        "slo": st.dictionaries(st.sampled_from(["ttft_ms", "tpot_ms"]), NUMBER, max_size=2),
        "kv_transfer_params": _kv_params(), "ignore_eos": st.booleans(), "echo": st.booleans(),
    })  # fmt: skip
    completion = st.tuples(st.just("/v1/completions"),
                           st.fixed_dictionaries({"prompt": _prompt()}))  # fmt: skip
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                     "content": TEXT})  # fmt: skip
    chat = st.tuples(st.just("/v1/chat/completions"),
                     st.fixed_dictionaries({"messages": st.lists(message,
                                                                 max_size=3)}))  # fmt: skip
    return st.tuples(st.one_of(completion, chat), numbers, extras).map(
        lambda parts: (parts[0][0], parts[0][1] | parts[1] | parts[2])
    )


def header_strategy() -> st.SearchStrategy[dict[str, str]]:
    """The headers a router or a client may send, well-formed or not."""
    now = time.time()
    samples = [f"{now:.3f}", "0", f"{now + 3600:.3f}", "1e400"]
    times = st.one_of(TEXT, st.floats(allow_nan=True).map(str), st.sampled_from(samples))
    endpoints = st.one_of(TEXT, st.sampled_from(["127.0.0.1:9", "[::1]:9", "a:0", "x"]))
    return st.fixed_dictionaries({}, optional={
        "x-genpool-arrival-time": times, "x-prefiller-host-port": endpoints,
        "x-llm-d-slo-ttft-ms": times, "x-llm-d-slo-tpot-ms": times,
    })  # fmt: skip


def _header_safe(headers: dict[str, str]) -> dict[str, str]:
    """HTTP cannot carry every text: such a header is sent as its JSON spelling."""
    return {k: v if v.isascii() and v.isprintable() else json.dumps(v) for k, v in headers.items()}


def run_bodies(tally: Tally, num_cases: int, seed_value: int) -> None:
    """hypothesis: bodies, headers and handles the schema does not describe."""
    with httpx.Client(base_url=tally.url, timeout=CASE_TIMEOUT_S) as client:

        @seed(seed_value)
        @_settings(num_cases)
        @given(request=body_strategy(), headers=header_strategy())
        def one(request: tuple[str, dict[str, Any]], headers: dict[str, str]) -> None:
            path, body = request
            raw = json.dumps(body)
            label = f"POST {path} {raw} headers={headers}"
            try:
                reply = client.post(path, content=raw, headers=_header_safe(headers)
                                    | {"content-type": "application/json"})  # fmt: skip
            except httpx.HTTPError as exc:
                tally.record("bodies", label, None, repr(exc))
                return
            tally.record("bodies", label, reply.status_code,
                         reply.text[:300] if reply.status_code >= 500 else "")  # fmt: skip

        one()


Runner = Callable[[Tally, int, int], None]
