"""Chat prompts in the model's own template, rendered by the worker's jinja2 sandbox:
the same ids as transformers' renderer for the SmolLM2 GGUF and an HF checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from genpool_worker.chat_template import (
    FALLBACK_CHAT_TEMPLATE,
    ChatPrompter,
    ChatTemplateError,
    chat_prompter,
    compile_template,
)
from genpool_worker.engine_io import ModelInfo
from genpool_worker.model.gguf_weights import find_smollm2_gguf
from genpool_worker.model.tokenizer import load_tokenizer
from genpool_worker.synthetic import SyntheticTokenizer
from tests.model.hf_checkpoints import make_tokenizer

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    ],
]
REAL = ModelInfo("real", is_synthetic=False, max_seq_len=512, eos_token_ids=(2,))
SYNTHETIC = ModelInfo("synthetic:test", is_synthetic=True, max_seq_len=512, eos_token_ids=(0,))


@pytest.mark.parametrize("chat", CHATS)
def test_smollm2_gguf_template_matches_transformers(chat: list[dict[str, str]]) -> None:
    tokenizer = load_tokenizer(find_smollm2_gguf())
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    ids = chat_prompter(tokenizer, REAL).prompt_ids(chat)
    assert ids == tokenizer.apply_chat_template(chat)
    assert tokenizer.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")


def test_hf_checkpoint_template_adds_no_second_bos(tmp_path: Path) -> None:
    make_tokenizer().save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path)  # its encode() adds BOS; a rendered chat must not
    chat = [{"role": "user", "content": "w3 w4"}]
    ids = chat_prompter(tokenizer, REAL).prompt_ids(chat)
    assert ids == tokenizer.apply_chat_template(chat)
    assert tokenizer.bos_token_id not in ids
    assert tokenizer.encode("w3")[0] == tokenizer.bos_token_id  # plain text does get one


def test_synthetic_model_gets_the_documented_fallback() -> None:
    prompter = chat_prompter(SyntheticTokenizer(), SYNTHETIC)
    ids = prompter.prompt_ids(CHATS[1][:2])
    assert SyntheticTokenizer().decode(ids) == "system: Be terse.\nuser: Hi\nassistant:"
    assert "assistant:" in FALLBACK_CHAT_TEMPLATE


def test_a_real_model_without_a_template_cannot_chat() -> None:
    prompter = chat_prompter(SyntheticTokenizer(), REAL)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        prompter.prompt_ids(CHATS[0])


def test_templates_run_sandboxed_and_may_refuse_messages() -> None:
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError):
        ChatPrompter(compile_template(escape), SyntheticTokenizer().encode).prompt_ids(CHATS[0])
    mutate = "{{ messages.append(1) }}"  # immutable sandbox: no side effects on the input
    with pytest.raises(ChatTemplateError):
        ChatPrompter(compile_template(mutate), SyntheticTokenizer().encode).prompt_ids(CHATS[0])
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    prompter = ChatPrompter(compile_template(strict), SyntheticTokenizer().encode)
    with pytest.raises(ChatTemplateError, match="user first"):
        prompter.prompt_ids(CHATS[1])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        compile_template("{% for %}")
    as_json = compile_template("{{ messages[0] | tojson }}")
    assert as_json(messages=[{"role": "user", "content": "<é>"}]) == (
        '{"role": "user", "content": "<é>"}'
    )
