"""Our LlamaModel and tokenizer against transformers on the same GGUF (docs/design.md#model).

Tolerance. float32 on both sides; the remaining differences come from summation
order (oneDNN vs MKL GEMMs, fused QKV / gate-up, our attention vs SDPA). Measured on
the 2-core AMD EPYC (AVX2) over these 4 prompts x (prefill + 4 decode steps): max
|ours - hf| over the vocabulary 3.4e-5 .. 1.1e-4 with max |hf logit| 15.6 .. 36.4, at
most 3.7e-6 of the logit scale (with MKL GEMMs instead: 2.1e-4, 5.9e-6). We allow
REL_TOL = 1e-4 of the logit scale, ~17-27x the measured worst case; a wrong RoPE
layout, norm, mask or GQA mapping shows up at 1e-1 or more.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from genpool_worker.model import cpu_attention
from tests.model.conftest import CHATS, NEW_TOKENS
from tests.model.paged import BlockPool, greedy, interleaved_tables, run_with_pauses

REL_TOL = 1e-4
DECODE_STEPS = 4

PLAIN_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Then it",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Kubernetes operators reconcile custom resources into",
]


def _chat(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return ids


def _hf_last_logits(hf_model: Any, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(torch.tensor([ids])).logits[0, -1].float()


def _close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    scale = ref.abs().max().item()
    diff = (ours - ref).abs().max().item()
    assert diff <= REL_TOL * scale, f"max |diff| {diff:.3g} > {REL_TOL} * {scale:.3g}"


def test_prefill_and_decode_logits_match_transformers(
    runner: Any, hf_model: Any, tokenizer: Any
) -> None:
    prompts = [tokenizer.encode(p) for p in PLAIN_PROMPTS] + [_chat(tokenizer, CHATS[0])]
    tables = interleaved_tables(
        runner.kv.num_blocks, runner.kv.block_size, [len(p) + DECODE_STEPS for p in prompts]
    )
    for table, ids in zip(tables, prompts, strict=True):
        ids = list(ids)
        logits = runner.prefill(table, ids)
        assert logits.shape == (runner.model.vocab_size,) and logits.dtype == torch.float32
        _close(logits, _hf_last_logits(hf_model, ids))
        for _ in range(DECODE_STEPS):
            ids.append(int(logits.argmax()))
            logits = runner.decode([table], [ids[-1]], [len(ids) - 1])[0]
            _close(logits, _hf_last_logits(hf_model, ids))


def test_greedy_answers_paris(runner: Any, tokenizer: Any) -> None:
    ids = _chat(tokenizer, "What is the capital of France?")
    blocks = BlockPool.of(runner, seed=1).table(len(ids) + NEW_TOKENS)
    text = tokenizer.decode(greedy(runner, blocks, ids, NEW_TOKENS))
    assert "Paris" in text, text


def test_greedy_text_equals_transformers_generate(
    runner: Any, tokenizer: Any, chat_refs: list[tuple[list[int], list[int]]]
) -> None:
    """Each chat alone (batch 1, with a padding row every other one), in scattered
    blocks: the same tokens, and so the same text, as transformers' ``generate``."""
    pool = BlockPool.of(runner, seed=2)
    for n, (ids, ref) in enumerate(chat_refs):
        blocks = pool.table(len(ids) + NEW_TOKENS)
        ours = greedy(runner, blocks, ids, NEW_TOKENS, pad=n % 2 == 1)
        assert tokenizer.decode(ours) == tokenizer.decode(ref), tokenizer.decode(ids)
        assert ours == ref


def test_greedy_with_pauses_equals_transformers_paged_and_static(
    runner: Any,
    static_runner: Any,
    gathered_runner: Any,
    tokenizer: Any,
    chat_refs: list[tuple[list[int], list[int]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chats generated together (requests paused in place and resumed, blocks reused,
    padding rows): paged, in scattered blocks of 16, read in place by the CPU kernel and
    gathered by torch, and in the static layout (one ``max_seq_len`` block per request,
    consecutive), each the same as transformers."""
    prompts = [ids for ids, _ in chat_refs]
    kernel_calls = _count_calls(monkeypatch, cpu_attention, "paged_decode_attention")
    paged, log = run_with_pauses(runner, BlockPool.of(runner, seed=3), prompts, NEW_TOKENS)
    assert log.grown  # tables grew mid-decode, from blocks interleaved with the others'
    assert kernel_calls  # (3 rows at most: the kernel's batch at any thread count)
    for (ids, ref), ours in zip(chat_refs, paged, strict=True):
        assert tokenizer.decode(ours) == tokenizer.decode(ref), tokenizer.decode(ids)
        assert ours == ref
    calls_before = len(kernel_calls)
    pool = BlockPool.of(gathered_runner, seed=3)
    gathered, _ = run_with_pauses(gathered_runner, pool, prompts, NEW_TOKENS)
    assert gathered == paged and len(kernel_calls) == calls_before

    # The static layout reads K/V in place while the batch's blocks are consecutive
    # (the pre-paging fast path) and gathers them otherwise; both must have run.
    paths: list[bool] = []
    consecutive = static_runner.kv.cache.consecutive_run

    def spy(tables: Any, length: int) -> int | None:
        run = consecutive(tables, length)
        paths.append(run is not None)
        return run

    monkeypatch.setattr(static_runner.kv.cache, "consecutive_run", spy)
    static, _ = run_with_pauses(
        static_runner, BlockPool.of(static_runner, seed=None), prompts, NEW_TOKENS
    )
    assert static == paged
    assert any(paths) and not all(paths), paths


def _count_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[None]:
    """``module.name`` wrapped to note each call (one entry per call)."""
    calls: list[None] = []
    original = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize(
    "text",
    [
        "Hello world!",
        "  leading spaces, tabs\tand\nnewlines\n\n",
        "Ça va? 12345 ünïcödé 🤗 中文",
        "special <|im_end|> inside <|im_start|>",
        "",
    ],
)
def test_tokenizer_encode_matches_transformers(
    tokenizer: Any, hf_tokenizer: Any, text: str
) -> None:
    ids = tokenizer.encode(text)
    assert ids == hf_tokenizer.encode(text)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_tokenizer_chat_template_and_special_ids(tokenizer: Any, hf_tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    for msgs in (messages, messages[1:2]):
        ref = hf_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)
        assert tokenizer.apply_chat_template(msgs) == list(ref["input_ids"])
    ids = tokenizer.apply_chat_template(messages[1:2])
    assert tokenizer.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert tokenizer.decode([tokenizer.eos_token_id]) == ""  # special tokens skipped


def test_tokenizer_cache_round_trip(
    gguf_path: Any, hf_tokenizer: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold cache converts once and stores; a warm one loads the stored copy, same ids.

    The GGUF conversion itself (~8 s) is replaced by the oracle fixture's result, which
    is exactly what it would return; loading the stored copy is real.
    """
    import transformers

    from genpool_worker.model import load_tokenizer

    real = transformers.AutoTokenizer.from_pretrained
    conversions: list[str] = []

    def from_pretrained(path: Any, *args: Any, gguf_file: str | None = None, **kw: Any) -> Any:
        if gguf_file is None:
            return real(path, *args, **kw)
        conversions.append(gguf_file)
        return hf_tokenizer

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setenv("GENPOOL_CACHE_DIR", str(tmp_path))
    cold = load_tokenizer(gguf_path)
    (entry,) = (tmp_path / "tokenizers").iterdir()
    assert (entry / "tokenizer.json").is_file()
    warm = load_tokenizer(gguf_path)
    assert conversions == [gguf_path.name]  # the warm load did not convert again
    assert warm._tok is not hf_tokenizer
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    ref = hf_tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
    for tok in (cold, warm):
        assert tok.apply_chat_template(chat) == list(ref["input_ids"])
        assert tok.encode("Ça va? 🤗") == hf_tokenizer.encode("Ça va? 🤗")
        assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
