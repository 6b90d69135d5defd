"""One pass's sampling, batched on the logits' device (docs/worker.md#sampling).

Every row of the pass goes through one call: penalties (repetition on prompt and output,
presence and frequency on output), greedy rows by argmax, the others by temperature,
top-k, top-p and min-p, then one inverse-CDF draw per row. The draw's uniform number comes
from the request's own seeded CPU generator, so every rank (same logits, same seed) and
every rerun picks the same token; the only device-to-host transfer is the result (tokens,
and the logprobs asked for, packed in one tensor). Logprobs are of the model's logits
(``log_softmax`` before penalties and temperature), as vLLM reports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from genpool_worker.sampling_params import SamplingParams, TokenLogprobs


@dataclass
class PenaltyCounts:
    """A penalised request's tokens as counts on the logits' device, kept across passes
    and updated by each sampled token: a pass reads them, never rebuilds them from the
    token lists (which cost every row's whole output, each pass)."""

    seen: torch.Tensor  # [vocab] bool: in the prompt or the output (repetition)
    output: torch.Tensor  # [vocab] float: occurrences in the output (presence, frequency)

    @classmethod
    def of(cls, prompt_ids: Sequence[int], output_ids: Sequence[int], vocab: int,
           device: torch.device) -> PenaltyCounts:  # fmt: skip
        output = _counts([output_ids], vocab, device)[0]
        seen = (output > 0) | (_counts([prompt_ids], vocab, device)[0] > 0)
        return cls(seen, output)

    def add(self, token: int) -> None:
        if 0 <= token < self.output.shape[0]:
            self.output[token] += 1
            self.seen[token] = True


@dataclass
class SampleRow:
    """What sampling one row needs: its params, generator and the tokens so far (penalties)."""

    params: SamplingParams
    generator: torch.Generator | None
    prompt_ids: Sequence[int]
    output_ids: list[int]  # until its first penalised draw makes ``counts`` from them
    # Never drawn this pass: EOS and the stop tokens until ``min_tokens`` are out (vLLM's
    # rule), set by the runner before each pass.
    masked_ids: tuple[int, ...] = ()
    counts: PenaltyCounts | None = None  # penalties only, from the first draw on

    def took(self, token: int) -> None:
        """``token`` is its output's next (only penalties read the output so far)."""
        if not self.params.has_penalties:
            return
        if self.counts is None:
            self.output_ids.append(token)
        else:
            self.counts.add(token)

    def penalty_counts(self, vocab: int, device: torch.device) -> PenaltyCounts:
        if self.counts is None:
            self.counts = PenaltyCounts.of(self.prompt_ids, self.output_ids, vocab, device)
            self.output_ids = []  # counted: the counts carry on from here
        return self.counts


def sample(
    logits: torch.Tensor, rows: Sequence[SampleRow]
) -> tuple[list[int], list[TokenLogprobs | None]]:
    """``logits`` ``[len(rows), vocab]``: each row's token, and its logprobs if it asked."""
    scores = logits.float()
    if any(row.params.has_penalties for row in rows):
        scores = _penalised(scores, rows)
    if any(row.masked_ids for row in rows):
        scores = _masked(scores, rows)
    tokens = scores.argmax(dim=-1)
    drawn = [i for i, row in enumerate(rows) if not row.params.is_greedy]
    if drawn:
        index = torch.tensor(drawn, device=scores.device)
        tokens[index] = _draw(scores.index_select(0, index), [rows[i] for i in drawn])
    return _to_host(logits, tokens, rows)


def _masked(scores: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
    """Each row's ``masked_ids`` at -inf (ids past the vocabulary are none of its tokens)."""
    vocab = scores.shape[-1]
    pairs = [(i, t) for i, row in enumerate(rows) for t in row.masked_ids if 0 <= t < vocab]
    if not pairs:
        return scores
    index = torch.tensor(pairs, device=scores.device)
    masked = scores.clone()
    masked[index[:, 0], index[:, 1]] = float("-inf")
    return masked


def _draw(scores: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
    """Temperature, then top-k / top-p / min-p on the sorted probabilities, then the
    inverse CDF at each row's uniform draw."""
    device = scores.device
    temperature = torch.tensor([r.params.temperature for r in rows], device=device)
    probs = torch.softmax(scores / temperature[:, None], dim=-1)
    ordered, order = probs.sort(dim=-1, descending=True)
    if any(r.params.is_filtered for r in rows):
        ordered = _filtered(ordered, rows)
    cdf = ordered.cumsum(dim=-1)
    uniform = torch.tensor([float(torch.rand(1, generator=r.generator)) for r in rows],
                           device=device, dtype=cdf.dtype)  # fmt: skip
    target = uniform[:, None] * cdf[:, -1:]
    position = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
    return order.gather(1, position).squeeze(1)


def _filtered(ordered: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
    """Zero the sorted probabilities outside each row's top-k, top-p and min-p (the most
    likely token always stays)."""
    device = ordered.device
    rank = torch.arange(ordered.shape[-1], device=device)[None, :]
    vocab = ordered.shape[-1]  # a top_k past the vocabulary keeps every token
    top_k = torch.tensor([min(r.params.top_k or vocab, vocab) for r in rows], device=device)
    top_p = torch.tensor([r.params.top_p for r in rows], device=device, dtype=ordered.dtype)
    min_p = torch.tensor([r.params.min_p for r in rows], device=device, dtype=ordered.dtype)
    before = ordered.cumsum(dim=-1) - ordered  # probability mass ahead of each token
    cut = (rank >= top_k[:, None]) | (before >= top_p[:, None])
    cut |= ordered < min_p[:, None] * ordered[:, :1]
    cut[:, 0] = False
    return ordered.masked_fill(cut, 0.0)


def _penalised(scores: torch.Tensor, rows: Sequence[SampleRow]) -> torch.Tensor:
    """vLLM's penalties on the rows that have them: repetition divides a positive logit
    (multiplies a negative one) of every token in the prompt or output; presence and
    frequency subtract per output token (OpenAI's definition)."""
    vocab, device = scores.shape[-1], scores.device
    index = [i for i, row in enumerate(rows) if row.params.has_penalties]
    counts = [rows[i].penalty_counts(vocab, device) for i in index]
    out_counts = torch.stack([c.output for c in counts])
    seen = torch.stack([c.seen for c in counts])

    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, device=device, dtype=scores.dtype)[:, None]

    params = [rows[i].params for i in index]
    repetition = column([p.repetition_penalty for p in params])
    frequency = column([p.frequency_penalty for p in params])
    presence = column([p.presence_penalty for p in params])
    rows_index = torch.tensor(index, device=device)
    some = scores.index_select(0, rows_index)
    factor = torch.where(some > 0, 1.0 / repetition, repetition)
    some = torch.where(seen, some * factor, some)
    some = some - frequency * out_counts - presence * (out_counts > 0).to(some.dtype)
    return scores.index_copy(0, rows_index, some)  # a copy: the logits stay for logprobs


def _counts(ids: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """``[rows, vocab]`` occurrences of each token id in each row's list."""
    width = max((len(row) for row in ids), default=0)
    if width == 0:
        return torch.zeros(len(ids), vocab, device=device)
    padded = torch.full((len(ids), width), vocab, dtype=torch.long)  # the padding column
    for i, row in enumerate(ids):
        padded[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
    counts = torch.zeros(len(ids), vocab + 1, device=device)
    counts.scatter_add_(1, padded.to(device), torch.ones(padded.shape, device=device))
    return counts[:, :vocab]


def _to_host(
    logits: torch.Tensor, tokens: torch.Tensor, rows: Sequence[SampleRow]
) -> tuple[list[int], list[TokenLogprobs | None]]:
    """One transfer: the tokens, and (when any row asked) each row's chosen logprob and
    its top alternatives, packed as float64 columns (token ids are exact in them)."""
    wanted = [r.params.num_logprobs for r in rows]
    if all(n is None for n in wanted):
        return [int(t) for t in tokens.tolist()], [None] * len(rows)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    width = max(n or 0 for n in wanted)
    chosen = logprobs.gather(1, tokens[:, None])
    top_values, top_ids = (
        logprobs.topk(width, dim=-1) if width else (chosen[:, :0], tokens[:, None][:, :0])
    )
    packed = torch.cat([tokens[:, None].double(), chosen.double(), top_ids.double(),
                        top_values.double()], dim=1).tolist()  # fmt: skip
    results: list[TokenLogprobs | None] = []
    for row, n in zip(packed, wanted, strict=True):
        if n is None:
            results.append(None)
            continue
        top = tuple((int(row[2 + j]), row[2 + width + j]) for j in range(n))
        results.append(TokenLogprobs(row[1], top))
    return [int(row[0]) for row in packed], results
