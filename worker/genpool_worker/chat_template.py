"""Chat messages to prompt ids with the model's own chat template.

The template comes from the checkpoint: a GGUF's ``tokenizer.chat_template`` metadata,
an HF directory's ``tokenizer_config.json`` / ``chat_template.jinja``. It is rendered
with jinja2 in an immutable sandbox (a template is data from a model download: it must
not reach Python objects), with the globals and options Hugging Face templates expect.
The synthetic model has no template and gets ``FALLBACK_CHAT_TEMPLATE``; a real model
without one cannot chat (its prompt format is unknown), so chat requests get a 400.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn, Protocol, runtime_checkable

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from genpool_worker.engine_io import ModelInfo, Tokenizer

log = logging.getLogger(__name__)

# Synthetic models only: one "role: content" line per message, then "assistant:".
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


class ChatTemplateError(ValueError):
    """A template that does not compile, or refuses these messages (``raise_exception``)."""


@runtime_checkable
class TemplatedTokenizer(Protocol):
    """A tokenizer that carries its checkpoint's chat template (model/tokenizer.py)."""

    @property
    def chat_template(self) -> str | None: ...

    @property
    def special_tokens(self) -> dict[str, str]: ...

    def encode_rendered(self, text: str) -> list[int]: ...


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # jinja2's own tojson HTML-escapes; templates expect plain JSON (as transformers does).
    return json.dumps(value, ensure_ascii=False, indent=indent)


def compile_template(source: str) -> Callable[..., str]:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])  # fmt: skip
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source).render
    except TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from None


@dataclass(frozen=True)
class ChatPrompter:
    """Renders a chat (ending with the assistant's turn) and encodes it as the template
    wrote it: special tokens in the text are the template's, none are added. Without
    ``render`` the model cannot chat, and ``unavailable`` says why."""

    render: Callable[..., str] | None
    encode: Callable[[str], list[int]]
    special_tokens: dict[str, str] = field(default_factory=dict)
    unavailable: str = ""

    def prompt_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        if self.render is None:
            raise ChatTemplateError(self.unavailable)
        try:
            text = self.render(messages=list(messages), add_generation_prompt=True,
                               **self.special_tokens)  # fmt: skip
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, ValueError) as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None
        return self.encode(text)


def chat_prompter(tokenizer: Tokenizer, info: ModelInfo) -> ChatPrompter:
    """The model's prompter; one without ``render`` when the model cannot chat."""
    if isinstance(tokenizer, TemplatedTokenizer) and tokenizer.chat_template:
        try:
            render = compile_template(tokenizer.chat_template)
        except ChatTemplateError as exc:
            log.error("model %s: %s", info.name, exc)
            return ChatPrompter(None, tokenizer.encode, unavailable=f"model {info.name}: {exc}")
        return ChatPrompter(render, tokenizer.encode_rendered, tokenizer.special_tokens)
    if info.is_synthetic:
        return ChatPrompter(compile_template(FALLBACK_CHAT_TEMPLATE), tokenizer.encode)
    reason = f"model {info.name} has no chat template: use /v1/completions"
    return ChatPrompter(None, tokenizer.encode, unavailable=reason)
