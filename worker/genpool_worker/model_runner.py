"""The model runner: prefill, decode and sampling on torch, for the engine loop.

The loop hands it each pass's plan; it returns one sampled token per batch member, and
with speculative decoding the drafts each verified and accepted before it
(``speculator``: drafts up to the plan's limits, verified in one forward).
It keeps what the model step needs per request (prompt, last token, position,
sampling parameters and the seeded generator), so the loop never touches a tensor.
It holds a network (``DecodeModel``: layers, no state between calls) and the KV cache
it runs over (``KVCacheOwner``: the cache, sized and allocated, the decode steps
replayed from CUDA graphs over it, and the P/D port), built together at load
(``worker_cli.build_model``; ``model/cache_engine.py`` for a Llama).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

import torch

from genpool_core.plan import GenPlan
from genpool_worker.engine_io import Arrival, ModelInfo, StepResult
from genpool_worker.kv_connector import NO_KV_CONNECTOR, KVExecutionSide
from genpool_worker.kv_layout import KVLayout
from genpool_worker.model.kv_cache import PrefillSpan
from genpool_worker.model.runner_protocols import DecodeModel, KVCacheOwner, Tables
from genpool_worker.model.sampler import sample
from genpool_worker.request_faults import RequestFaults
from genpool_worker.run_state import RunState, sample_row
from genpool_worker.sampling_params import TokenLogprobs
from genpool_worker.speculative import NgramDrafter, SpeculativeConfig
from genpool_worker.speculator import Speculator

SHARED_PREFIX_FAILED = "a prefix it shares was being computed by a request that failed"
CacheT = TypeVar("CacheT")  # the KV cache's type (the owner's, which the network takes)


class TorchModelRunner(Generic[CacheT]):
    """A network and the KV cache it runs over: the plan's passes, sampled."""

    def __init__(
        self,
        model: DecodeModel[CacheT],
        kv: KVCacheOwner[CacheT],
        speculative: SpeculativeConfig | None = None,
    ) -> None:
        """``speculative``: draft and verify tokens (``--speculative-config``; None: off);
        a ``DrafterModelError`` when the network cannot run its drafter."""
        self.model = model
        self.kv = kv
        self.speculative = speculative
        self._states: dict[str, RunState] = {}
        self._speculator: Speculator[CacheT] | None = None
        if speculative is not None:
            self._speculator = Speculator(speculative, model, kv.cache, self._states)
        vocab_size = getattr(model, "vocab_size", None)
        self.info = ModelInfo(
            name=model.name,
            is_synthetic=model.is_synthetic,
            max_seq_len=model.max_seq_len,
            eos_token_ids=tuple(model.eos_token_ids),
            vocab_size=vocab_size if isinstance(vocab_size, int) else None,
            num_kv_blocks=kv.num_blocks,
            kv_block_size=kv.block_size,
        )

    def add_request(self, arrival: Arrival) -> None:
        eos = () if arrival.ignore_eos else self.info.eos_token_ids
        spec = self.speculative
        # Logprobs are reported per step's token: a request that asks for them drafts nothing.
        drafting = spec is not None and arrival.sampling.num_logprobs is None
        ngram = None
        if drafting and spec is not None and spec.method == "ngram":
            ngram = NgramDrafter(arrival.prompt_ids, *spec.lookup_range)
        self._states[arrival.request_id] = RunState(
            list(arrival.prompt_ids), sample_row(arrival), min_tokens=arrival.min_tokens,
            stop_ids=(*eos, *arrival.stop_token_ids), is_drafting=drafting, drafter=ngram,
            num_draft_tokens=spec.num_speculative_tokens if drafting and spec else 0,
            max_tokens=arrival.max_tokens,
        )  # fmt: skip

    def remove_request(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def execute(self, plan: GenPlan, kv: KVExecutionSide = NO_KV_CONNECTOR) -> StepResult:
        """Run ``plan.prefill_chunks`` (chunked prefill), prefill ``plan.prefill_ids``
        (their token this pass; their last chunk), decode the rest; each request's KV
        goes to the block table its admission's plan gave it, its prefill starting after
        the prompt tokens the prefix cache held; ``kv`` loads the KV of
        ``plan.imported_ids``, and nobody else's, into theirs (the plan decides, never the
        runner). Prefill work runs in plan order: an admission may share blocks an
        earlier one computes in the same pass. The whole batch is sampled in one call; a
        request still mid-prefill has no row. What one request causes fails it alone
        (``StepResult.failed``; request_faults.py), and so does a request sharing blocks
        whose prefill failed this pass. With speculative decoding the members verify the
        drafts the plan states, and, once the pass's tokens are drawn, each member's
        drafts for its next step are proposed (``StepResult.drafts``: the engine hands
        them to the scheduler, whose next plan states them)."""
        faults = RequestFaults()
        cached = plan.admitted_cached_tokens or (0,) * len(plan.admitted_ids)
        imported = set(plan.imported_ids)
        for request_id, blocks, num_cached in zip(
            plan.admitted_ids, plan.admitted_blocks, cached, strict=True
        ):
            with faults.of(request_id):
                self._admit(self._states[request_id], blocks, num_cached)
                if request_id in imported:
                    self._load(request_id, kv)
        prefill = set(plan.prefill_ids)
        ends = {rid: end for rid, _, end in plan.prefill_chunks}
        # Chunks short of their prompts (no row), then the batch's prefills (their last chunk).
        work = [(rid, end) for rid, end in ends.items() if rid not in prefill]
        work += [(rid, ends.get(rid, len(self._states[rid].prompt_ids)))
                 for rid in plan.batch_ids if rid in prefill]  # fmt: skip
        prefilled = self._prefill_all(work, faults)
        rows: list[torch.Tensor] = []
        order = [rid for rid in plan.batch_ids if rid in prefilled and rid in prefill]
        if order:
            rows.append(torch.stack([prefilled[rid] for rid in order]))
        decoding = [r for r in plan.batch_ids if r not in prefill and r not in faults.failed]
        verified, drafted = ({}, {}) if self._speculator is None else (
            self._speculator.step(plan, decoding, faults))  # fmt: skip
        decoding = [r for r in decoding if r not in verified and r not in faults.failed]
        if decoding:
            kept, decoded = faults.retry_alone(
                decoding, self._decode_rows, lambda r: self._decode_rows([r])
            )
            rows.extend(decoded)
            order.extend(kept)
        tokens = self._sample(order, torch.cat(rows), faults) if order else {}
        drafts = {} if self._speculator is None else self._speculator.propose(plan, faults)
        logprobs = {rid: lp for rid, (_, lp) in tokens.items() if lp is not None}
        drawn = {rid: t for rid, (t, _) in tokens.items() if rid not in faults.failed}
        drawn.update({rid: v.token for rid, v in verified.items() if rid not in faults.failed})
        accepted = {rid: v.accepted for rid, v in verified.items() if v.accepted}
        return StepResult(drawn, logprobs, faults.failed, accepted, drafted, drafts)

    def _prefill_all(
        self, work: list[tuple[str, int]], faults: RequestFaults
    ) -> dict[str, torch.Tensor]:
        """Each ``(request, end)``'s prefill up to ``end``, in forwards of several prompts
        (``_forwards``); its logits there. A forward that raises is run again one request
        at a time, in plan order, so what one request causes fails it alone."""
        logits: dict[str, torch.Tensor] = {}
        for forward in self._forwards([w for w in work if w[0] not in faults.failed]):
            ready = [(rid, end) for rid, end in forward if self._is_prefillable(rid, faults)]
            if not ready:
                continue
            try:
                logits.update(zip([rid for rid, _ in ready], self._prefill_to(ready), strict=True))
            except Exception:
                for request_id, end in ready:
                    if self._is_prefillable(request_id, faults):
                        with faults.of(request_id):
                            logits[request_id] = self._prefill_to([(request_id, end)])[0]
        return logits

    def _forwards(self, work: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
        """``work`` in plan order, cut into forwards of at most ``max_seq_len`` new tokens
        (a longer prompt alone): a forward's activations stay within the one-prompt peak
        the cache was sized beside (``cache_engine``)."""
        forwards: list[list[tuple[str, int]]] = []
        tokens = self.info.max_seq_len
        for request_id, end in work:
            new = end - self._states[request_id].num_prefilled
            if not forwards or tokens + new > self.info.max_seq_len:
                forwards.append([])
                tokens = 0
            forwards[-1].append((request_id, end))
            tokens += new
        return forwards

    def _is_prefillable(self, request_id: str, faults: RequestFaults) -> bool:
        """Not failed, and reads no block whose writer failed this pass (else it fails too)."""
        if request_id in faults.failed:
            return False
        state = self._states[request_id]
        if self._bad_blocks(faults).isdisjoint(state.blocks[: state.num_cached_blocks]):
            return True
        faults.fail(request_id, RuntimeError(SHARED_PREFIX_FAILED))
        return False

    def _bad_blocks(self, faults: RequestFaults) -> set[int]:
        return {b for rid in faults.failed if rid in self._states for b in self._states[rid].blocks}

    def _sample(
        self, order: list[str], logits: torch.Tensor, faults: RequestFaults
    ) -> dict[str, tuple[int, TokenLogprobs | None]]:
        """Each row's token (and logprobs), in one call; a row that breaks it fails alone."""
        states = {rid: self._states[rid] for rid in order}
        for state in states.values():
            state.mask_stops()
        index = {rid: i for i, rid in enumerate(order)}

        def alone(rid: str) -> tuple[list[int], list[TokenLogprobs | None]]:
            return sample(logits[index[rid] : index[rid] + 1], [states[rid].sample])

        kept, drawn = faults.retry_alone(
            order, lambda ids: sample(logits, [states[r].sample for r in ids]), alone
        )
        tokens = [t for batch in drawn for t in batch[0]]
        logprobs = [lp for batch in drawn for lp in batch[1]]
        for rid, token in zip(kept, tokens, strict=True):
            states[rid].took(token)
        return dict(zip(kept, zip(tokens, logprobs, strict=True), strict=True))

    def _prefill_to(self, work: Sequence[tuple[str, int]]) -> torch.Tensor:
        """Each request's prompt from where its KV ends up to its ``end``, in one forward;
        last-position logits ``[len(work), vocab]``.

        From its own count, not the chunk's start: a pass the engine did not run (no
        batch member, chunks only) is caught up here rather than leaving a KV gap. The
        counts move only once the forward has run.
        """
        states = [(self._states[rid], end) for rid, end in work]
        spans = [PrefillSpan(s.blocks, s.prompt_ids[s.num_prefilled : end], s.num_prefilled)
                 for s, end in states]  # fmt: skip
        logits = self.model.prefill_many(self.kv.cache, spans)
        for state, end in states:
            state.num_prefilled = end
        return logits

    def _decode_rows(self, request_ids: Sequence[str]) -> torch.Tensor:
        tables, last, positions = [], [], []
        for request_id in request_ids:
            state = self._states[request_id]
            assert state.last_token is not None, f"{request_id} decodes before its prefill"
            tables.append(state.blocks)
            last.append(state.last_token)
            positions.append(state.position)
        return self.decode(tables, last, positions)

    # ---- one pass of the network over the cache (what execute runs; benchmarks too) ----

    def prefill(self, blocks: Sequence[int], token_ids: list[int], start: int = 0) -> torch.Tensor:
        """``token_ids`` into ``blocks`` at positions ``start..``; the last one's logits."""
        return self.model.prefill_many(self.kv.cache, [PrefillSpan(blocks, token_ids, start)])[0]

    def decode(
        self, block_tables: Tables, token_ids: list[int], positions: list[int]
    ) -> torch.Tensor:
        """One token per row at its position; logits ``[B, vocab]``. Replayed from the
        cache owner's CUDA graphs where it has them, else the network's own decode."""
        graphs = self.kv.decode_graphs
        if graphs is not None:
            return graphs.run(block_tables, token_ids, positions)
        return self.model.decode(self.kv.cache, block_tables, token_ids, positions)

    def _admit(self, state: RunState, blocks: tuple[int, ...], num_cached: int) -> None:
        """Its blocks, the first ``num_cached`` prompt tokens' KV already in them (the prefix
        cache's)."""
        state.blocks = blocks
        state.num_prefilled = num_cached
        state.num_cached_blocks = -(-num_cached // self.info.kv_block_size)

    def _load(self, request_id: str, kv: KVExecutionSide) -> None:
        """The plan imports its prompt's KV: ``kv`` writes it into its blocks and it
        decodes from the first token made with it (no prefill here)."""
        state = self._states[request_id]
        first = kv.load_kv(request_id, state.blocks)
        state.num_prefilled = len(state.prompt_ids)
        state.took(first)

    # The cache's port (``kv_connector.KVCachePort``): the cache engine's.

    def kv_layout(self) -> KVLayout | None:
        return self.kv.kv_layout()

    def read_kv(self, blocks: Sequence[int]) -> Iterator[bytes]:
        return self.kv.read_kv(blocks)

    def write_kv(self, blocks: Sequence[int], data: bytearray) -> None:
        self.kv.write_kv(blocks, data)
