"""A request's state in the model runner: what its next model step needs (prompt, block
table, last token, position) and what its sampling carries from step to step (the
seeded generator, penalty counts, the speculative drafter's history)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from genpool_worker.engine_io import Arrival
from genpool_worker.model.sampler import SampleRow
from genpool_worker.speculative import NgramDrafter


@dataclass
class RunState:
    prompt_ids: list[int]
    sample: SampleRow
    blocks: tuple[int, ...] = ()  # the KV block table, from the plan that admitted it
    num_output_tokens: int = 0
    num_prefilled: int = 0  # prompt tokens whose KV is written (cached, or prefilled)
    num_cached_blocks: int = 0  # its table's first blocks, shared from the prefix cache
    last_token: int | None = field(default=None)
    min_tokens: int = 0
    # What may not end it before ``min_tokens`` (vLLM masks them): EOS unless ``ignore_eos``,
    # and its stop tokens.
    stop_ids: tuple[int, ...] = ()
    # Speculative decoding: whether it drafts (speculation on, and no logprobs asked), and
    # the n-gram drafter's index over its prompt and output (method ngram). Both kept while
    # it is paused, so a resumed request drafts from its whole history (early_exit's
    # drafter state is its own KV, pinned with its blocks).
    is_drafting: bool = False
    drafter: NgramDrafter | None = None
    # How many drafts it asks for next (drafters.next_draft_length), at most k.
    num_draft_tokens: int = 0
    max_tokens: int | None = None  # its output's limit (None: the context's)

    @property
    def position(self) -> int:
        """Where its last token goes (its KV not yet written): its length less one."""
        return len(self.prompt_ids) + self.num_output_tokens - 1

    @property
    def max_drafts(self) -> int:
        """Drafts its next step could verify: its draft length, within what it may still
        emit besides its own token (the plan cuts them the same way); none once a stop
        token ended it (past ``min_tokens`` they are not masked, so one drawn ends the
        request: it has no next step, and early exit's drafts cost a forward each)."""
        if self.last_token in self.stop_ids and self.num_output_tokens >= self.min_tokens:
            return 0
        if self.max_tokens is None:
            return self.num_draft_tokens
        return max(0, min(self.num_draft_tokens, self.max_tokens - self.num_output_tokens - 1))

    def mask_stops(self) -> None:
        """Before this pass's draw: EOS and stop tokens masked while short of min_tokens."""
        self.sample.masked_ids = self.stop_ids if self.num_output_tokens < self.min_tokens else ()

    def took(self, token: int) -> None:
        self.last_token = token
        self.num_output_tokens += 1
        self.sample.took(token)
        if self.drafter is not None:
            self.drafter.extend((token,))


def sample_row(arrival: Arrival) -> SampleRow:
    params = arrival.sampling
    generator = None
    if not params.is_greedy:
        # A stable seed (not hash()): every rank must draw the same tokens. The generator
        # is a CPU one on every device: it only draws one uniform number per step.
        seed = params.seed if params.seed is not None else zlib.crc32(arrival.request_id.encode())
        generator = torch.Generator().manual_seed(seed)
    return SampleRow(params, generator, arrival.prompt_ids, [])
