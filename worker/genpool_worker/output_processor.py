"""Detokenize and stream: each sampled token becomes a text delta for its client, and
a finished request gets its last text and a ``Finished`` event. Decoding is incremental
(:mod:`genpool_worker.detokenizer`): a token costs a decode of a few tokens, not of the
whole output. Stop strings are matched here, on every rank, so the engine finishes a
matched request as a stop in the next pass (counted as completed, never aborted). No
torch here."""

from __future__ import annotations

from genpool_core.request import FinishReason
from genpool_worker.engine_io import EngineRequest, Tokenizer
from genpool_worker.events import Finished, TokenDelta, Usage
from genpool_worker.sampling_params import TokenLogprobs


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        """``eos_token_ids``: every id that ends a generation; none of them is text."""
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)

    def on_token(
        self, request: EngineRequest, token: int, logprobs: TokenLogprobs | None = None
    ) -> None:
        """Append ``token`` and send the text that is new and complete (with the tokens'
        logprobs when the request asked for them)."""
        request.output_ids.append(token)
        is_eos = token in self.eos_token_ids
        if request.arrival.sampling.num_logprobs is not None and not is_eos:
            request.unsent_logprobs.append((token, logprobs))
        detokenizer = request.detokenizer
        if not is_eos:  # no EOS id is text (one before min_tokens included)
            detokenizer.ids.append(token)
        end = len(detokenizer.ids)
        if token in request.arrival.stop_token_ids and not is_eos:
            end -= 1  # nor is a stop token that ends the output
        text = detokenizer.new_text(self.tokenizer, end)
        if text:
            self._send(request, text)

    def _send(self, request: EngineRequest, text: str) -> None:
        """Through the stop matcher: what may still begin a stop string is held back."""
        matcher = request.stop_matcher
        if matcher is not None:
            text = matcher.feed(text)
        if text:
            request.emit(TokenDelta(text, tuple(request.unsent_logprobs), len(request.output_ids)))
            request.unsent_logprobs.clear()

    def on_finished(self, request: EngineRequest, reason: FinishReason) -> None:
        """Flush any held-back text, then close the stream with the plan's reason."""
        detokenizer = request.detokenizer
        ids, end = detokenizer.ids, len(detokenizer.ids)
        if ids and reason is FinishReason.STOP and ids[-1] in request.arrival.stop_token_ids:
            end -= 1  # a stop token ends the text, as EOS does
        text = detokenizer.new_text(self.tokenizer, end, is_final=True)
        if text:
            self._send(request, text)
        if request.stop_matcher is not None and (tail := request.stop_matcher.flush()):
            request.emit(TokenDelta(tail, tuple(request.unsent_logprobs), len(request.output_ids)))
            request.unsent_logprobs.clear()
        if request.unsent_logprobs:  # tokens whose text the stop matcher dropped
            request.emit(TokenDelta("", tuple(request.unsent_logprobs), len(request.output_ids)))
            request.unsent_logprobs.clear()
        usage = Usage(len(request.arrival.prompt_ids), len(request.output_ids),
                      request.num_cached_tokens)  # fmt: skip
        request.emit(Finished(reason, usage))
