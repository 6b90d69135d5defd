"""Chat with real SmolLM2-135M weights on the CPU: the GGUF's own chat template."""

from __future__ import annotations

from collections.abc import Callable

from genpool_worker.model.gguf_weights import find_smollm2_gguf
from genpool_worker.model.tokenizer import load_tokenizer
from tests.worker.conftest import RunningWorker

Factory = Callable[..., RunningWorker]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_smollm2_chat_uses_its_template_and_answers_paris(worker_factory: Factory) -> None:
    worker = worker_factory(model="smollm2-135m", max_batch_size=2, max_seq_len=512)
    reference = load_tokenizer(find_smollm2_gguf()).apply_chat_template(QUESTION)
    with worker.client() as client:
        chat = {"messages": QUESTION, "max_tokens": 12}
        reply = client.post("/v1/chat/completions", json=chat)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert "Paris" in body["choices"][0]["message"]["content"]
        assert body["usage"]["prompt_tokens"] == len(reference)
        stopped = client.post("/v1/chat/completions", json=chat | {"stop": "Paris"})
        answer = stopped.json()["choices"][0]
        assert answer["finish_reason"] == "stop" and "Paris" not in answer["message"]["content"]
        assert answer["message"]["content"] in body["choices"][0]["message"]["content"]
