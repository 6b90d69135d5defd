"""``POST /v1/completions/render`` and ``POST /v1/chat/completions/render``: a request's
prompt token ids without generating, as vLLM's render endpoints give them to llm-d's
token producer (its ``vllm`` backend), which keys its prefix-cache lookups by them
(docs/worker.md#render-endpoints).

A body is what the generating route takes (the producer forwards the client's request,
its ``model`` set to the one it is configured with), checked the same way, and the ids
are the ones that route would serve: text through the tokenizer, token ids as given, a
chat through the model's template. Completions answer a list, one object per prompt;
a chat one object. Each object carries ``token_ids`` (what the producer reads of vLLM's
``GenerateRequest``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from genpool_worker.api import ChatCompletionRequest, CompletionRequest
from genpool_worker.chat_route import chat_prompt_ids
from genpool_worker.choices import check_model
from genpool_worker.completions_route import prompt_ids
from genpool_worker.http_common import context_of, read_json

router = APIRouter()


@router.post("/v1/completions/render")
async def completions_render(request: Request) -> Response:
    context = context_of(request)
    body = await read_json(request, CompletionRequest, limits=context.edge_limits)
    check_model(context, body.model)
    return JSONResponse([{"token_ids": prompt_ids(context, p)} for p in body.prompts()])


@router.post("/v1/chat/completions/render")
async def chat_completions_render(request: Request) -> Response:
    context = context_of(request)
    body = await read_json(request, ChatCompletionRequest, limits=context.edge_limits)
    check_model(context, body.model)
    return JSONResponse({"token_ids": chat_prompt_ids(context, body)})
