"""What the SDK tests share: clients on a worker, and its /stats and stat line read back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai

from genpool_core.statline import StatLine, parse_statline
from tests.polling import wait_for
from tests.worker.conftest import RunningWorker

Factory = Callable[..., RunningWorker]
MODEL = "synthetic:test"
HELLO: list[Any] = [{"role": "user", "content": "hello"}]
# A stat interval no test outlives: /statline is then the since-start line, live every pass.
SINCE_START = 3600.0


def sdk(worker: RunningWorker) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{worker.url}/v1", api_key="unused", max_retries=0)


def async_sdk(worker: RunningWorker) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{worker.url}/v1", api_key="unused", max_retries=0, timeout=120.0
    )


def stats(worker: RunningWorker) -> dict[str, Any]:
    with worker.client() as client:
        body: dict[str, Any] = client.get("/stats").json()
        return body


def statline(worker: RunningWorker) -> tuple[str, StatLine]:
    """The latest stat line, as text and parsed."""
    with worker.client() as client:
        text = client.get("/statline").text.strip()
    parsed = parse_statline(text)
    assert parsed is not None, text
    return text, parsed


def raw_fields(text: str) -> dict[str, str]:
    """A stat line's ``key=value`` tokens as written (``-`` stays ``-``)."""
    return dict(token.split("=", 1) for token in text.split() if "=" in token)


def stats_when(worker: RunningWorker, what: str, check: Callable[[dict[str, Any]], bool]) -> Any:
    """``/stats`` once ``check`` holds (the snapshot follows a reply by up to a pass)."""

    def ready() -> dict[str, Any] | None:
        now = stats(worker)
        return now if check(now) else None

    return wait_for(ready, what, timeout=20)
