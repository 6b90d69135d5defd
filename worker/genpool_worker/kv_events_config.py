"""``--kv-events-config``: vLLM's ``KVEventsConfig`` as JSON, the same field names and
defaults, so a deployment that configures vLLM's KV events configures a GenPool worker's
(docs/worker.md#kv-events). Parsing only: the publisher is ``kv_events.py``.

``enable_kv_cache_events`` false, or ``publisher`` ``"null"``, publishes nothing (vLLM's
rule: an unset publisher is ``"zmq"`` when events are enabled). The PUB socket binds when
the endpoint has a wildcard (``*``, ``::``) or is ``ipc://`` / ``inproc://``, and
connects otherwise (vLLM's rule: bind for a subscriber that dials each pod, connect to a
central subscriber)."""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from genpool_core.names import DEFAULT_KV_EVENTS_PORT

FLAG = "--kv-events-config"
DEFAULT_ENDPOINT = f"tcp://*:{DEFAULT_KV_EVENTS_PORT}"
MAX_TOPIC_CHARS = 1024
MAX_STEPS = 10_000_000  # buffer_steps, hwm, max_queue_size: batches
_SCHEMES = ("tcp://", "ipc://", "inproc://")
_TCP = re.compile(r"^tcp://(\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class KVEventsConfig(BaseModel):
    """vLLM's fields, checked: an unknown field, a wrong type or a bad endpoint is refused."""

    model_config = ConfigDict(extra="forbid", strict=True)

    enable_kv_cache_events: bool = False
    publisher: Literal["zmq", "null"] | None = None  # None: zmq when enabled (vLLM's rule)
    endpoint: str = DEFAULT_ENDPOINT
    replay_endpoint: str | None = None
    buffer_steps: int = Field(default=10_000, ge=1, le=MAX_STEPS)
    hwm: int = Field(default=100_000, ge=0, le=MAX_STEPS)
    max_queue_size: int = Field(default=100_000, ge=1, le=MAX_STEPS)
    topic: str = Field(default="", max_length=MAX_TOPIC_CHARS)

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(_SCHEMES):
            raise ValueError(f"{value!r} is not a ZeroMQ address (tcp://, ipc://, inproc://)")
        match = _TCP.match(value) if value.startswith("tcp://") else None
        if value.startswith("tcp://") and (match is None or not 0 < int(match[2]) < 65536):
            raise ValueError(f"{value!r} is not tcp://<host or *>:<port 1-65535>")
        return value

    @property
    def is_publishing(self) -> bool:
        """Whether a ZMQ publisher runs (enabled, and the publisher is not ``"null"``)."""
        return self.enable_kv_cache_events and self.publisher != "null"


def binds(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard or local transport, connect to anything else."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def parse_kv_events_config(text: str) -> KVEventsConfig:
    """The flag's JSON object, checked; a ``ValueError`` naming the flag in one line."""
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{FLAG} is not valid JSON: {exc}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{FLAG} must be a JSON object, got {type(loaded).__name__}")
    try:
        return KVEventsConfig.model_validate(loaded)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise ValueError(f"{FLAG}: {problems}") from None
