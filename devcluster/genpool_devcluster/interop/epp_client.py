"""Envoy's part towards llm-d's epp (ext_proc), and one completion through the sidecar."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from genpool_devcluster.interop.common import DESTINATION, PREFILL_HEADER, SCORES


@dataclass
class Pick:
    call: Any
    endpoint: str
    headers: dict[str, str]
    # each endpoint's score, when the epp runs with --emit-endpoint-scores
    scores: dict[str, float] = field(default_factory=dict)


class EppClient:
    """Envoy's part towards the epp (ext_proc, FULL_DUPLEX_STREAMED), one stream a request:
    request headers and body in, the pick out; later the reply through it, so the epp
    finishes its accounting. tests/integration/epp_gateway.py does the same for GIE's."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def __aenter__(self) -> EppClient:
        import grpc
        from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub

        self.channel = grpc.aio.insecure_channel(self.address)
        self.stub = ExternalProcessorStub(self.channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    @staticmethod
    def _map(pairs: list[tuple[str, str]]) -> Any:
        from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue

        return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])

    async def _read(self, call: Any, phase: str) -> Any:
        import grpc

        answer = await call.read()
        if answer is grpc.aio.EOF:
            raise RuntimeError(f"epp: stream closed before its {phase} answer")
        kind = answer.WhichOneof("response")
        if kind == "immediate_response":
            raise RuntimeError(f"epp refused: {answer.immediate_response}")
        if kind != phase:
            raise RuntimeError(f"epp: a {kind} answer, not {phase}")
        return answer

    async def pick(self, path: str, body: bytes, authority: str) -> Pick:
        from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

        call = self.stub.Process()
        headers = {"content-type": "application/json", "x-request-id": str(uuid.uuid4())}
        pseudo = [(":method", "POST"), (":path", path), (":authority", authority),
                  (":scheme", "http")]  # fmt: skip
        sent = ep.HttpHeaders(headers=self._map([*pseudo, *headers.items()]))
        await call.write(ep.ProcessingRequest(request_headers=sent))
        await call.write(
            ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True))
        )
        answer = await self._read(call, "request_headers")
        for option in answer.request_headers.response.header_mutation.set_headers:
            h = option.header
            headers[h.key.lower()] = h.raw_value.decode() if h.raw_value else h.value
        meta = answer.dynamic_metadata.fields
        namespace, key = DESTINATION
        picked = (meta[namespace].struct_value.fields[key].string_value if namespace in meta
                  else headers.get(key, ""))  # fmt: skip
        fields = meta[namespace].struct_value.fields if namespace in meta else {}
        scored = fields[SCORES].struct_value.fields if SCORES in fields else {}
        scores = {endpoint: value.number_value for endpoint, value in scored.items()}
        while True:  # the (re-serialised) body, up to end_of_stream
            streamed = (await self._read(call, "request_body")).request_body.response
            if streamed.body_mutation.streamed_response.end_of_stream:
                break
        return Pick(call, picked.split(",")[0], headers, scores)

    async def finish(self, pick: Pick, status: int, headers: list[tuple[str, str]],
                     body: bytes) -> None:  # fmt: skip
        from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

        call = pick.call
        sent = ep.HttpHeaders(headers=self._map([(":status", str(status)), *headers]))
        await call.write(ep.ProcessingRequest(response_headers=sent))
        await self._read(call, "response_headers")
        await call.write(ep.ProcessingRequest(response_body=ep.HttpBody(body=body)))
        await call.write(ep.ProcessingRequest(response_body=ep.HttpBody(end_of_stream=True)))
        while True:
            answer = await self._read(call, "response_body")
            if answer.response_body.response.body_mutation.streamed_response.end_of_stream:
                break
        await call.done_writing()


async def pd_completion(
    epp_address: str | None,
    sidecar: str,
    body: dict[str, Any],
    headers: dict[str, str],
) -> tuple[str, str, str]:
    """One completion through the sidecar: (text, the epp's decode pick, the prefiller).
    With ``epp_address`` the epp picks (ext_proc) and its ``x-prefiller-host-port`` is
    sent; without, ``headers`` must name the prefiller."""
    import openai

    async with openai.AsyncOpenAI(base_url=f"{sidecar}/v1", api_key="unused", max_retries=0) as sdk:
        if epp_address is None:
            reply = await sdk.completions.create(**body, extra_headers=headers)
            return reply.choices[0].text, "", headers.get(PREFILL_HEADER, "")
        async with EppClient(epp_address) as client:
            authority = sidecar.removeprefix("http://")
            pick = await client.pick("/v1/completions", json.dumps(body).encode(), authority)
            prefiller = pick.headers.get(PREFILL_HEADER, "")
            sent = {**headers, PREFILL_HEADER: prefiller} if prefiller else dict(headers)
            raw = await sdk.completions.with_raw_response.create(**body, extra_headers=sent)
            http = raw.http_response
            reply = raw.parse()
            answer = [(k.lower(), v) for k, v in http.headers.items()]
            await client.finish(pick, http.status_code, answer, http.content)
    return reply.choices[0].text, pick.endpoint, prefiller
