"""The fault run's client side (bench/faults.py): closed-loop ``openai`` SDK clients
streaming completions through the endpoint-picker gateway, each request recorded with how
it ended. No request may hang (each has the SDK's own timeout) and none may end silently:
a stream that stops without a finish reason or an error is counted as ``truncated``."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import openai

REQUEST_TIMEOUT_S = 60.0  # a request still open after this is a hang
MAX_TOKENS = 24


@dataclass(frozen=True, slots=True)
class Record:
    started: float  # monotonic s
    ended: float
    outcome: str  # "ok", "truncated" (ended without a finish reason), or "error:<cause>"


def _cause(exc: Exception) -> str:
    """A failed request's cause, as a client sees it: the HTTP status, an error event in
    the stream, or the transport error (its class: a cut stream, a refused connection,
    the client's own timeout)."""
    if isinstance(exc, openai.APIStatusError):
        return f"error:http {exc.status_code}"
    if isinstance(exc, openai.APIConnectionError):  # the SDK wraps the transport's error
        inner = exc.__cause__ or exc.__context__
        return f"error:{type(exc).__name__} ({type(inner).__name__})"
    if isinstance(exc, openai.APIError):  # an error event inside the stream
        return "error:stream error event"
    return f"error:{type(exc).__name__}"


class StreamingLoad:
    """``clients`` threads, each sending one streamed completion after another."""

    def __init__(self, base_url: str, model: str, clients: int) -> None:
        self.sdk = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                                 timeout=REQUEST_TIMEOUT_S)  # fmt: skip
        self.model = model
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self) -> StreamingLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 10)

    def _client(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            outcome = self._one()
            with self._lock:
                self.records.append(Record(started, time.monotonic(), outcome))
            if outcome != "ok":
                time.sleep(0.2)  # a client backs off a little after an error

    def _one(self) -> str:
        prompt = f"fault run {uuid.uuid4().hex[:8]}: tell me a story"  # no prefix affinity
        try:
            stream: Any = self.sdk.completions.create(
                model=self.model, prompt=prompt, max_tokens=MAX_TOKENS, stream=True
            )
            finish = None
            for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
        except Exception as exc:  # every failure is recorded with its cause
            return _cause(exc)
        return "ok" if finish is not None else "truncated"

    def snapshot(self) -> list[Record]:
        with self._lock:
            return list(self.records)


def summarise(records: list[Record], since: float) -> dict[str, Any]:
    """Requests sent, by outcome, and their latency; times relative to ``since``."""
    outcomes = Counter(record.outcome for record in records)
    # A hang is a request the client's own timeout had to end, whatever error it became.
    hangs = [r for r in records if r.ended - r.started >= REQUEST_TIMEOUT_S]
    ok = sorted(r.ended - r.started for r in records if r.outcome == "ok")
    failed = [r for r in records if r.outcome != "ok"]
    return {
        "sent": len(records),
        "ok": outcomes.get("ok", 0),
        "failed": len(failed),
        "failed_by_cause": {k: v for k, v in sorted(outcomes.items()) if k != "ok"},
        "hangs": len(hangs),
        "truncated_silently": outcomes.get("truncated", 0),
        "ok_latency_p50_s": round(ok[len(ok) // 2], 3) if ok else None,
        "ok_latency_max_s": round(ok[-1], 3) if ok else None,
        "failures_at_s": [round(r.ended - since, 2) for r in failed],
    }
