"""The KV pull (docs/pd.md#the-pull): ``GET /v1/kv/{transfer_id}`` streams an export's
blocks, per layer K then V; the decode side reads it whole into host memory. Either
side breaking midway frees the prefill side's blocks (the registry) and the decode
side's buffer (never queued), and the request falls back to a local prefill."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import httpx

from genpool_worker.pd.context import PDContext
from genpool_worker.pd.exports import Export, ExportRegistry
from genpool_worker.pd.handle import Handle
from genpool_worker.pd.request_kv import KVImport

KV_PATH = "/v1/kv/{transfer_id}"


class PullFailed(Exception):
    """The blocks did not arrive whole (unreachable, 404, broken or short)."""


def kv_url(host: str, port: int, transfer_id: str) -> str:
    return f"http://{host}:{port}" + KV_PATH.format(transfer_id=transfer_id)


async def send_export(
    registry: ExportRegistry, export: Export, chunks: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """The pull's body; however it ends (sent, client gone, error) the blocks are freed."""
    is_ok = False
    try:
        async for chunk in chunks:
            yield chunk
        is_ok = True
    finally:
        registry.finish(export.transfer_id, is_ok=is_ok)


def secret_headers(pd: PDContext) -> dict[str, str]:
    """What a pull or cancel carries: the pool's KV secret, as a bearer token."""
    return {"authorization": f"Bearer {pd.kv_secret}"} if pd.kv_secret else {}


async def pull(pd: PDContext, handle: Handle) -> KVImport:
    """Read ``handle``'s blocks within the import caps (past the pull cap, in turn);
    raises ``ImportCapReached`` (nothing pulled) or ``PullFailed``. Counted in the import
    metrics."""
    await pd.imports.start_pull_in_turn(handle.num_bytes)
    kept = 0
    try:
        data = await _read(pd, handle)
        kept = len(data)
    finally:
        pd.imports.end_pull_in_turn(kept, handle.num_bytes)
    return KVImport(data, handle.num_blocks, on_release=lambda: pd.imports.release(kept))


async def _read(pd: PDContext, handle: Handle) -> bytearray:
    started = time.perf_counter()
    url = kv_url(handle.host, handle.port, handle.transfer_id)
    data = bytearray()
    try:
        async with pd.http.stream("GET", url, headers=secret_headers(pd)) as response:
            if response.status_code != 200:
                raise PullFailed(f"GET {url}: HTTP {response.status_code}")
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > handle.num_bytes:
                    raise PullFailed(f"GET {url}: more than the {handle.num_bytes} bytes announced")
    except (TimeoutError, httpx.HTTPError, PullFailed) as exc:
        pd.metrics.transfers.labels("import", "failed").inc()
        raise PullFailed(str(exc) or type(exc).__name__) from None
    if len(data) != handle.num_bytes:
        pd.metrics.transfers.labels("import", "failed").inc()
        raise PullFailed(f"GET {url}: {len(data)} of {handle.num_bytes} bytes")
    seconds = time.perf_counter() - started
    pd.metrics.transfers.labels("import", "ok").inc()
    pd.metrics.transfer_bytes.labels("import").inc(len(data))
    pd.metrics.transfer_seconds.observe(seconds)
    pd.metrics.ttft_parts.labels("transfer").observe(seconds)
    return data


async def cancel(pd: PDContext, handle: Handle) -> None:
    """Tell the prefill worker its blocks will not be pulled (best effort: they expire)."""
    url = kv_url(handle.host, handle.port, handle.transfer_id)
    with contextlib.suppress(httpx.HTTPError):
        await pd.http.delete(url, headers=secret_headers(pd))
