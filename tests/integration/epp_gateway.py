"""A small HTTP gateway that plays Envoy's part in front of GIE's endpoint picker (EPP).

The EPP is GIE's own ``cmd/epp``, unmodified: an Envoy ext_proc gRPC server. This gateway
is its client the way Envoy's ext_proc filter is in GIE's FULL_DUPLEX_STREAMED set-up. Per
request to ``/v1/*`` it opens one ``ExternalProcessor.Process`` stream and

1. sends ``request_headers`` (``:method``, ``:path``, ``:authority``, ``:scheme``, an
   ``x-request-id`` as Envoy adds, and the client's headers) and ``request_body`` with
   ``end_of_stream`` (no body: the headers carry ``end_of_stream``);
2. reads the EPP's answers: a headers response whose dynamic metadata
   ``envoy.lb/x-gateway-destination-endpoint`` (also a set header) names the pod it picked,
   then the body as it wants it forwarded (re-serialised JSON); or an ``immediate_response``
   (no endpoints, bad request), which becomes a JSON error reply here;
3. forwards the request there, with ``x-genpool-arrival-time`` (the gateway's receipt time,
   the router stamp GenPool's workers key admission by);
4. sends the reply through the EPP too (``response_headers``, then ``response_body``
   chunks and an empty one with ``end_of_stream``) and passes on what the EPP sends back:
   chunk by chunk for SSE, the whole body at its end otherwise. That is how the EPP
   finishes its accounting of the request (usage, latency metrics, running requests).

The ext_proc channel is plaintext: start the EPP with ``--secure-serving=false`` (its
default self-signed certificate names no host, so only a client that skips verification,
as GIE's Envoy set-ups do, could use it).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import grpc
import httpx
import uvicorn
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from genpool_worker.arrival_key import ARRIVAL_HEADER
from tests.integration.endpoint_picker import free_port
from tests.polling import wait_for

DESTINATION = ("envoy.lb", "x-gateway-destination-endpoint")  # GIE's pkg/epp/metadata
LEFT_GRACE_S = 5.0  # a reply whose client left gets this long to end, then it is cut off
NOT_FORWARDED = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def _header_map(pairs: list[tuple[str, str]]) -> HeaderMap:
    return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])


def _apply(headers: dict[str, str], common: ep.CommonResponse) -> dict[str, str]:
    """A CommonResponse's header mutation on ``headers`` (lower-case keys)."""
    out = dict(headers)
    for option in common.header_mutation.set_headers:
        header = option.header
        out[header.key.lower()] = header.raw_value.decode() if header.raw_value else header.value
    for key in common.header_mutation.remove_headers:
        out.pop(key.lower(), None)
    return out


def _forwardable(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if not k.startswith(":") and k not in NOT_FORWARDED}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "gateway", "code": status}}, status)


class GatewayError(Exception):
    """A reply that is not the model server's: the status and a message for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class EppGateway:
    """The gateway app; ``routed`` counts the endpoints the EPP picked, per endpoint."""

    def __init__(self, epp_address: str) -> None:
        self.epp_address = epp_address
        self.routed: Counter[str] = Counter()
        self.tasks: set[asyncio.Task[None]] = set()
        self.app = Starlette(
            routes=[Route("/v1/{rest:path}", self.handle, methods=["GET", "POST"])],
            lifespan=self._lifespan,
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with grpc.aio.insecure_channel(self.epp_address) as channel:
            self.stub = ExternalProcessorStub(channel)
            async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=10)) as http:
                self.http = http
                yield
                if self.tasks:  # replies whose clients left, still ending through the EPP
                    await asyncio.wait(self.tasks, timeout=LEFT_GRACE_S)

    async def handle(self, request: Request) -> Response:
        arrival = time.time()
        body = await request.body()
        call: Any = self.stub.Process()  # one ext_proc stream per HTTP request, as Envoy
        try:
            endpoint, headers, body = await self._route(call, request, body)
            self.routed[endpoint] += 1
            headers[ARRIVAL_HEADER] = repr(arrival)
            url = f"http://{endpoint}{request.url.path}"
            forward = self.http.build_request(
                request.method, url, params=request.query_params, headers=_forwardable(headers),
                content=body,
            )  # fmt: skip
            try:
                upstream = await self.http.send(forward, stream=True)
            except httpx.TransportError as exc:
                raise GatewayError(502, f"endpoint {endpoint}, the EPP's pick: {exc!r}") from exc
            try:
                return await self._respond(call, upstream)
            except BaseException:
                await upstream.aclose()
                raise
        except GatewayError as exc:
            call.cancel()
            return _error(exc.status, str(exc))
        except grpc.aio.AioRpcError as exc:
            detail = f"{exc.code().name}: {exc.details()}"
            return _error(502, f"endpoint picker at {self.epp_address}: {detail}")

    async def _route(
        self, call: Any, request: Request, body: bytes
    ) -> tuple[str, dict[str, str], bytes]:
        """The request phases: the endpoint the EPP picked, the headers and body to send."""
        headers = {k.lower(): v for k, v in request.headers.items()}
        headers.setdefault("x-request-id", str(uuid.uuid4()))
        pseudo = [
            (":method", request.method),
            (":path", request.url.path),
            (":authority", headers.pop("host", "")),
            (":scheme", "http"),
        ]
        sent = ep.HttpHeaders(headers=_header_map([*pseudo, *headers.items()]))
        sent.end_of_stream = not body
        await call.write(ep.ProcessingRequest(request_headers=sent))
        if body:
            message = ep.HttpBody(body=body, end_of_stream=True)
            await call.write(ep.ProcessingRequest(request_body=message))
        answer = await self._read(call, "request_headers")
        headers = _apply(headers, answer.request_headers.response)
        meta = answer.dynamic_metadata.fields
        namespace, key = DESTINATION
        picked = (
            meta[namespace].struct_value.fields[key].string_value
            if namespace in meta
            else headers.get(key, "")
        )
        endpoint = picked.split(",")[0]  # a list is the pick, then fallbacks in order
        if not endpoint:
            raise GatewayError(500, "endpoint picker: no destination endpoint in its answer")
        chunks = []
        while body:  # the body as the EPP forwards it, in chunks up to end_of_stream
            streamed = (await self._read(call, "request_body")).request_body.response
            chunks.append(streamed.body_mutation.streamed_response.body)
            if streamed.body_mutation.streamed_response.end_of_stream:
                break
        return endpoint, headers, b"".join(chunks)

    async def _read(self, call: Any, phase: str) -> ep.ProcessingResponse:
        """The EPP's next answer, which must be for ``phase``; its refusals raise."""
        answer = await call.read()
        if answer is grpc.aio.EOF:
            raise GatewayError(502, f"endpoint picker: stream closed, no {phase} answer")
        kind = answer.WhichOneof("response")
        if kind == "immediate_response":
            refusal = answer.immediate_response
            status = refusal.status.code or 500
            raise GatewayError(status, f"endpoint picker: {refusal.body.decode() or status}")
        if kind != phase:
            raise GatewayError(502, f"endpoint picker: a {kind} answer, not {phase}")
        assert isinstance(answer, ep.ProcessingResponse)
        return answer

    async def _respond(self, call: Any, upstream: httpx.Response) -> Response:
        """The response phases: the reply's headers and body through the EPP to the client."""
        raw = [(k.decode().lower(), v.decode()) for k, v in upstream.headers.raw]
        status = [(":status", str(upstream.status_code))]
        sent = ep.HttpHeaders(headers=_header_map([*status, *raw]))
        await call.write(ep.ProcessingRequest(response_headers=sent))
        answer = await self._read(call, "response_headers")
        headers = _forwardable(_apply(dict(raw), answer.response_headers.response))

        pieces: asyncio.Queue[bytes | None] = asyncio.Queue()
        broke: list[BaseException] = []

        async def send_body() -> None:
            try:
                async for chunk in upstream.aiter_raw():
                    await call.write(ep.ProcessingRequest(response_body=ep.HttpBody(body=chunk)))
            except Exception as exc:
                # The reply broke midway (its pod died): as Envoy resets the client's
                # stream, end it now; the EPP's stream is cancelled, so nobody waits on it.
                broke.append(exc)
                pieces.put_nowait(None)
                call.cancel()
                raise
            await call.write(ep.ProcessingRequest(response_body=ep.HttpBody(end_of_stream=True)))

        async def pump() -> None:
            # Full duplex, as Envoy: the EPP answers each SSE chunk, a JSON body at its end.
            sender = asyncio.create_task(send_body())
            try:
                while True:
                    answer = await self._read(call, "response_body")
                    streamed = answer.response_body.response.body_mutation.streamed_response
                    pieces.put_nowait(streamed.body)
                    if streamed.end_of_stream:
                        break
                await sender
                await call.done_writing()
            finally:
                sender.cancel()
                await upstream.aclose()
                pieces.put_nowait(None)

        # A task of its own: an SDK closes its stream at `data: [DONE]`, before the EPP has
        # had the reply's end_of_stream, and the EPP records a stream's end only then.
        task = asyncio.create_task(pump())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

        async def body() -> AsyncIterator[bytes]:
            try:
                while (piece := await pieces.get()) is not None:
                    yield piece
                if broke:  # cut the reply short: the client sees it end without its close
                    raise RuntimeError(f"the reply from the pod broke: {broke[0]!r}")
                await task  # its error, if any, cuts the reply short
            finally:  # the client left: the reply has a grace to end, then it is cut off
                asyncio.get_running_loop().call_later(LEFT_GRACE_S, task.cancel)

        return StreamingResponse(body(), upstream.status_code, headers)


@contextmanager
def running_gateway(epp_address: str) -> Iterator[tuple[EppGateway, str]]:
    """The gateway served on a free loopback port in a thread: (gateway, base URL)."""
    gateway = EppGateway(epp_address)
    port = free_port()
    config = uvicorn.Config(gateway.app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="epp-gateway", daemon=True)
    thread.start()

    def is_serving() -> bool:
        if not thread.is_alive():
            raise RuntimeError("the EPP gateway exited before it served")
        return bool(server.started)

    wait_for(is_serving, what="the EPP gateway serving", timeout=30, interval=0.05)
    try:
        yield gateway, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
