"""Tokenizer from a GGUF file's metadata (GPT-2-style BPE and its chat template).

transformers converts the GGUF tokenizer (``AutoTokenizer.from_pretrained(dir,
gguf_file=...)``), which guarantees the same ids as the transformers oracle but
costs ~10 s: ``GGUFReader`` parses ~100k vocabulary strings in Python. The
converted tokenizer is therefore cached under ``~/.cache/genpool/tokenizers/<sha>``
(``GENPOOL_CACHE_DIR`` overrides the root), keyed by the GGUF file's content hash,
and later loads take ~0.2 s.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .config import ModelLoadError
from .gguf_file import GGUFLoadError

log = logging.getLogger(__name__)

_HASH_CHUNK = 1 << 22


def cache_root() -> Path:
    return Path(os.environ.get("GENPOOL_CACHE_DIR") or Path.home() / ".cache" / "genpool")


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()[:32]


class Tokenizer:
    """The few operations the worker needs, over a transformers fast tokenizer."""

    def __init__(self, backend: Any, *, add_special_tokens: bool = False) -> None:
        """``add_special_tokens``: what ``encode`` adds (an HF tokenizer's own BOS rule)."""
        self._tok = backend
        self._add_special_tokens = add_special_tokens
        eos = backend.eos_token_id
        if eos is None:
            raise ModelLoadError("the tokenizer has no EOS token")
        self.eos_token_id: int = int(eos)
        bos = backend.bos_token_id
        self.bos_token_id: int | None = None if bos is None else int(bos)
        self.vocab_size: int = len(backend)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text: no BOS for the GGUF (it sets ``add_bos_token = false``);
        an HF checkpoint's tokenizer adds what its own config says (Llama: BOS)."""
        return list(self._tok.encode(text, add_special_tokens=self._add_special_tokens))

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    @property
    def chat_template(self) -> str | None:
        """The checkpoint's Jinja chat template (GGUF metadata or tokenizer_config.json)."""
        template = getattr(self._tok, "chat_template", None)
        return template if isinstance(template, str) else None

    @property
    def special_tokens(self) -> dict[str, str]:
        """``bos_token`` / ``eos_token`` as text: variables every chat template may use."""
        names = ("bos_token", "eos_token")
        return {name: str(getattr(self._tok, name) or "") for name in names}

    def encode_rendered(self, text: str) -> list[int]:
        """Ids of a rendered chat: its special tokens are the template's, none added."""
        return list(self._tok.encode(text, add_special_tokens=False))

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of a chat in the checkpoint's template, ending with the assistant prompt
        (transformers' renderer: the reference the worker's own renderer is tested against)."""
        encoded = self._tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])


def load_tokenizer(gguf_path: str | Path, *, use_cache: bool = True) -> Tokenizer:
    """Tokenizer of a GGUF file (from the cache when the same file was converted before)
    or of an HF checkpoint directory (``tokenizer.json``, ``tokenizer_config.json``)."""
    from transformers import AutoTokenizer

    gguf_path = Path(gguf_path)
    if gguf_path.is_dir():
        return _load_hf_tokenizer(gguf_path)
    if not gguf_path.is_file():
        raise GGUFLoadError(f"GGUF file not found: {gguf_path}")
    cached = cache_root() / "tokenizers" / _file_digest(gguf_path) if use_cache else None
    if cached is not None and (cached / "tokenizer.json").is_file():
        try:
            return Tokenizer(AutoTokenizer.from_pretrained(cached))
        except Exception:  # a corrupt cache entry must not stop the worker: reconvert
            log.warning("tokenizer cache %s unreadable; converting again", cached, exc_info=True)
    try:
        backend = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except Exception as exc:
        raise GGUFLoadError(f"cannot read a tokenizer from {gguf_path}: {exc}") from exc
    if cached is not None:
        _save(backend, cached)
    return Tokenizer(backend)


def _load_hf_tokenizer(directory: Path) -> Tokenizer:
    from transformers import AutoTokenizer

    try:
        backend = AutoTokenizer.from_pretrained(directory)
    except Exception as exc:
        raise ModelLoadError(f"cannot read a tokenizer from {directory}: {exc}") from exc
    if getattr(backend, "chat_template", None) is None:
        log.warning("%s has no chat template: chat requests will fail", directory)
    return Tokenizer(backend, add_special_tokens=True)


def _save(backend: Any, target: Path) -> None:
    """Write the converted tokenizer atomically (rename), so readers never see half a cache."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
        backend.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race; its copy is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:  # read-only home etc.: caching is an optimisation only
        log.warning("cannot cache the tokenizer under %s", target.parent, exc_info=True)
