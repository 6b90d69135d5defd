"""P/D on real SmolLM2-135M weights (docs/pd.md): the decode worker's greedy text equals
the colocated worker's, for completions (its prefill leg sharing prefix-cached blocks),
chat and a prompt list with n choices (the decode worker drafting: speculative decoding
keeps the text), and the
decode worker ran no prefill of its own for a pulled request (its engine's plans show
none). The synthetic model's output ignores its KV, so only a real model shows that the
pulled KV landed in the right blocks, in the right order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from genpool_core.plan import GenPlan
from genpool_core.request import FinishReason
from genpool_worker.engine_io import EngineRequest
from tests.worker.conftest import RunningWorker
from tests.worker.pd_support import endpoint, metric, sidecar_exchange, wait_no_held_kv

Factory = Callable[..., RunningWorker]
REAL = {"model": "smollm2-135m", "max_batch_size": 4, "max_seq_len": 256}
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}  # fmt: skip
# Long enough for two full KV blocks of 16: the prefill leg for it finds them in the
# prefill worker's prefix cache (its colocated reference computed them first).
COMPLETION = {"prompt": "The history of the Roman Empire is long and eventful. It begins with"
              " a small settlement on seven hills beside the river Tiber, and its story",
              "max_tokens": 16, "temperature": 0}  # fmt: skip
CHAT = {"messages": [{"role": "user", "content": "Name three primary colours."}],
        "max_tokens": 16, "temperature": 0}  # fmt: skip
LISTS = {"prompt": ["Once upon a time, in a small village,", "List three prime numbers:"],
         "n": 2, "max_tokens": 12, "temperature": 0}  # fmt: skip


class PrefillsSeen:
    """Every request the engine prefilled (whole, or a chunk of)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    def on_plan(self, plan: GenPlan) -> None:
        self.ids.update(plan.prefill_ids)
        self.ids.update(request_id for request_id, _, _ in plan.prefill_chunks)

    def on_finished(self, request: EngineRequest, reason: FinishReason) -> None:
        pass


def texts(reply: dict[str, Any]) -> list[str]:
    return [c.get("text", c.get("message", {}).get("content")) for c in reply["choices"]]


def test_p_d_on_smollm2_decodes_the_colocated_text_without_a_prefill(
    worker_factory: Factory,
) -> None:
    # The prefill worker also serves plain requests whole: it is the colocated reference.
    prefill = worker_factory(role="prefill", **REAL)
    seen = PrefillsSeen()
    # The decode worker also drafts (n-gram speculative decoding, issue 37): its text must
    # still be the colocated one's, from the first token it decodes on the pulled KV.
    decode = worker_factory(role="decode", prefillers=endpoint(prefill.url), observer=seen,
                            speculative_config=SPEC, **REAL)  # fmt: skip
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        expected = prefill.client().post(path, json=body).json()
        _, reply = sidecar_exchange(prefill.url, decode.url, path, body)
        assert reply.status_code == 200, reply.text
        assert texts(reply.json()) == texts(expected), path
    assert seen.ids == set()  # every token came from the pulled KV: no prefill here
    # the leg shared the reference's cached blocks: P/D's text held with prefix caching
    assert metric(prefill.url, "vllm:prefix_cache_hits_total") >= 32
    assert metric(decode.url, "genpool_kv_transfers_total", side="import", outcome="ok") == 2
    # n choices of a prompt list: one export per prompt; choice 0 decodes from the pulled
    # KV, the others prefill locally (sharing what the prefix cache holds).
    expected = prefill.client().post("/v1/completions", json=LISTS).json()
    reply = decode.client().post("/v1/completions", json=LISTS)
    assert reply.status_code == 200, reply.text
    assert texts(reply.json()) == texts(expected)
    assert metric(decode.url, "genpool_kv_transfers_total", side="import", outcome="ok") == 4
    wait_no_held_kv(prefill.url)
    wait_no_held_kv(decode.url)
    assert metric(decode.url, "vllm:spec_decode_num_draft_tokens_total") > 0
