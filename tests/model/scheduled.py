"""Greedy generation the way the worker's engine drives the runner: the worker's
scheduler over the runner's KV blocks (admission, batching, block tables from the plan),
``execute`` per pass, and what each request emitted (several tokens a step with
speculative decoding) back to ``postprocess``. For the speculation tests on real networks:
the same prompts with and without drafts must give the same tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from genpool_core.kv_blocks import KVBudget
from genpool_core.preemption import GenCapacity
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_worker.engine_io import Arrival, StepResult
from genpool_worker.model_runner import TorchModelRunner
from genpool_worker.sampling_params import SamplingParams
from genpool_worker.speculative import SpeculativeConfig

NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_min=1,
                          prompt_lookup_max=2)  # fmt: skip
# The test checkpoints have 2 layers: the first one drafts.
EARLY_EXIT = SpeculativeConfig(method="early_exit", num_speculative_tokens=3, num_draft_layers=1)


def speculating(runner: Any, config: SpeculativeConfig = NGRAM) -> TorchModelRunner[Any]:
    """A runner over ``runner``'s network and cache that drafts with ``config``."""
    return TorchModelRunner(runner.model, runner.kv, config)


def scheduled_greedy(
    runner: TorchModelRunner[Any], prompts: Sequence[list[int]], max_tokens: int,
    max_batch_size: int = 3, digests: list[str] | None = None,
) -> tuple[list[list[int]], int]:  # fmt: skip
    """Each prompt's greedy tokens (``max_tokens``, or up to EOS), all submitted at once;
    and how many drafted tokens were verified. ``digests`` gets every plan's digest (its
    drafts included)."""
    speculative = runner.speculative
    k = 0 if speculative is None else speculative.num_speculative_tokens
    budget = KVBudget(runner.kv.num_blocks, runner.kv.block_size)
    scheduler = GenScheduler.from_settings(
        {}, GenCapacity(max_batch_size),
        SchedulerConfig(kv_budget=budget, num_speculative_tokens=k),
    )  # fmt: skip
    eos = set(runner.info.eos_token_ids)
    out: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        request_id = f"r{i}"
        runner.add_request(Arrival(request_id, list(prompt), max_tokens, SamplingParams()))
        scheduler.add_request(GenRequest(request_id, len(prompt), max_tokens,
                                         num_output_tokens=0), 0.0)  # fmt: skip
        out[request_id] = []
    drafted, now = 0, 0.0
    while scheduler.num_residents or scheduler.num_waiting:
        plan = scheduler.step(now)
        if digests is not None:
            digests.append(plan.digest())
        for request_id in plan.finished_ids:
            runner.remove_request(request_id)
        result = runner.execute(plan) if plan.batch_ids else StepResult({})
        assert not result.failed, result.failed
        drafted += sum(result.drafted.values())
        counts, stops = {}, []
        for request_id, token in result.tokens.items():
            emitted = [*result.accepted.get(request_id, ()), token]
            out[request_id] += emitted
            counts[request_id] = len(emitted)
            if token in eos:
                stops.append(request_id)
        now += 1.0
        drafts = {rid: d for rid, d in result.drafts.items() if rid in result.tokens}
        scheduler.postprocess(plan, now, tuple(stops), counts, drafts=drafts)
    return [out[f"r{i}"] for i in range(len(prompts))], drafted
