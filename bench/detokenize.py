"""Host cost of turning each sampled token into streamed text, per token, against the
output's length: the worker's incremental detokenizer (genpool_worker/detokenizer.py)
beside what the worker did before it, a decode of the whole output at every token.

SmolLM2's own tokenizer (the GGUF's, as the worker loads it) over a fixed English text
(this repository's docs/design.md, cut to each length), streamed token by token through
the same ``OutputProcessor`` the engine runs; the two are interleaved and the best of
``REPEATS`` kept. Both must stream exactly the text of the whole output (checked).

    python -m bench.run detokenize
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.versus import versus_row, versus_table
from genpool_core.request import FinishReason
from genpool_worker.detokenizer import INCOMPLETE_UTF8
from genpool_worker.engine_io import Arrival, EngineRequest, Tokenizer
from genpool_worker.events import TokenDelta
from genpool_worker.output_processor import OutputProcessor

__all__ = ["format_table", "run"]  # bench.run's interface

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = (128, 512, 2048)
REPEATS = 3


class WholeOutput(OutputProcessor):
    """The worker before incremental detokenization: the whole output decoded again at
    every token, and what is longer than what went out is sent."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer, ())
        self.sent: dict[str, int] = {}  # request id -> characters out

    def on_token(self, request: EngineRequest, token: int, logprobs: Any = None) -> None:
        request.output_ids.append(token)
        text = self.tokenizer.decode(request.output_ids)
        sent = self.sent.get(request.arrival.request_id, 0)
        if not text.endswith(INCOMPLETE_UTF8) and len(text) > sent:
            self._send(request, text[sent:])
            self.sent[request.arrival.request_id] = len(text)

    def on_finished(self, request: EngineRequest, reason: FinishReason) -> None:
        self.sent.pop(request.arrival.request_id, None)


def _stream(output: OutputProcessor, ids: list[int]) -> tuple[float, str]:
    """Seconds per token, and the text streamed."""
    request = EngineRequest(Arrival("bench", [1], max_tokens=len(ids)))
    pieces: list[str] = []

    def collect(event: object) -> None:
        if isinstance(event, TokenDelta):
            pieces.append(event.text)

    request.emit = collect  # type: ignore[method-assign]
    start = time.perf_counter()
    for token in ids:
        output.on_token(request, token)
    elapsed = time.perf_counter() - start
    output.on_finished(request, FinishReason.LENGTH)
    return elapsed / len(ids), "".join(pieces)


def _tokenizer() -> Tokenizer:
    from genpool_worker.model.gguf_weights import find_smollm2_gguf
    from genpool_worker.model.tokenizer import load_tokenizer

    return load_tokenizer(find_smollm2_gguf())


def run(*, quick: bool = False) -> dict[str, Any]:
    tokenizer = _tokenizer()
    corpus = tokenizer.encode((ROOT / "docs" / "design.md").read_text())
    lengths = (64, 256) if quick else LENGTHS
    rows = []
    for length in lengths:
        ids = corpus[:length]
        whole_text = tokenizer.decode(ids)
        best = {"incremental": float("inf"), "whole_output": float("inf")}
        for _ in range(1 if quick else REPEATS):
            for name, output in (("incremental", OutputProcessor(tokenizer, ())),
                                 ("whole_output", WholeOutput(tokenizer))):  # fmt: skip
                per_token, text = _stream(output, ids)
                if text != whole_text:
                    raise AssertionError(f"{name} streamed other text at {length} tokens")
                best[name] = min(best[name], per_token)
        rows.append(
            versus_row(
                ("output_tokens", length),
                ("incremental_us_per_token", best["incremental"]),
                ("whole_output_us_per_token", best["whole_output"]),
                2,
            )
        )
    return {
        "benchmark": "detokenize",
        "description": "host time per streamed token, incremental vs whole-output decoding",
        "tokenizer": "SmolLM2-135M (GGUF)",
        "corpus": "docs/design.md",
        "repeats": 1 if quick else REPEATS,
        "quick": quick,
        "rows": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    return versus_table(result["rows"], ("tokens", "incremental us", "whole output us", "ratio"))
