"""P/D's flags (docs/pd.md#roles): the worker's role, the prefill workers a decode worker
sends prefill legs to, how far it follows a router's header, the pool's KV secret, and
the caps on KV moving in and out. ``WorkerConfig`` inherits them, so they are flags and
GENPOOL_WORKER_CONFIG keys like every other field and are validated with the rest of the
configuration; ``setup.PDSettings`` reads them into the parts it builds."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from genpool_worker.host_port import parse_endpoints

DEFAULT_KV_EXPORT_TIMEOUT_S = 30.0  # a prefill leg's KV waits this long for its pull
# The KV import caps (docs/pd.md#the-pull): pulls in flight, and pulled bytes held.
DEFAULT_MAX_KV_PULLS = 8
DEFAULT_MAX_KV_IMPORT_BYTES = 1 << 30  # 1 GiB of host memory for pulled KV


class PDFlags(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["both", "prefill", "decode"] = Field(
        default="both",
        description="both (prefill and decode here), prefill (a P/D prefill tier: serves"
        " prefill legs and holds their KV for a decode worker to pull) or decode (pulls a"
        " prefill tier's KV; sends the prefill leg itself to --prefillers); docs/pd.md",
    )
    prefillers: str = Field(
        default="",
        description="prefill workers this worker sends prefill legs to, host:port,..."
        " (round robin; PUT /prefillers replaces them); empty: only when a request carries"
        " x-prefiller-host-port",
    )
    trust_prefiller_header: bool = Field(
        default=False,
        description="follow x-prefiller-host-port to any endpoint a router names; off: only"
        " to known prefill workers (--prefillers, PUT /prefillers), so a client cannot make"
        " this worker send requests elsewhere (docs/operations.md#threat-model)",
    )
    kv_secret_file: str | None = Field(
        default=None,
        description="file holding the pool's KV secret: pulls and cancels of this worker's"
        " KV need it, and this worker's own pulls send it (unset: GENPOOL_KV_SECRET_FILE,"
        " else pulls are open); the operator mounts it from <pool>-kv-secret",
    )
    max_kv_pulls: int = Field(
        default=DEFAULT_MAX_KV_PULLS,
        ge=1,
        le=1024,
        description="KV pulls in flight at once, requests; past it a pull waits its turn"
        " (up to 10 s, then the request is a 503)",
    )
    max_kv_import_bytes: int = Field(
        default=DEFAULT_MAX_KV_IMPORT_BYTES,
        ge=1,
        description="pulled KV held in host memory (in flight, or waiting for admission),"
        " bytes; past it a request is a 503",
    )
    kv_export_timeout_s: float = Field(
        default=DEFAULT_KV_EXPORT_TIMEOUT_S,
        gt=0,
        le=3600,
        description="how long a prefill leg's KV blocks stay held for the decode worker's"
        " pull before they are freed, seconds",
    )

    def check_roles(self, tensor_parallel_size: int) -> None:
        """The flags agree with each other and with the worker's tensor parallelism."""
        if self.role != "both" and tensor_parallel_size != 1:
            raise ValueError(f"--role {self.role} needs --tensor-parallel-size 1 (P/D moves"
                             " the KV of one rank; docs/pd.md)")  # fmt: skip
        if self.role == "prefill" and self.prefillers:
            raise ValueError("--prefillers is for a decode worker, not --role prefill")
        parse_endpoints(self.prefillers.split(","))
