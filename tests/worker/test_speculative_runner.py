"""Speculative decoding in the model runner, on small fake networks: drafts verified in one
forward, what is emitted equal to decoding without speculation (greedy, penalised, and
seeded sampling alike), rejection sampling keeping the target distribution (chi-square),
stops ending a run, and a paused request's drafter kept in place (DESIGN.md 7.1); for
both drafters, n-gram and early exit."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from genpool_core.plan import GenPlan
from genpool_core.preemption import GenCapacity
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler, SchedulerConfig
from genpool_worker.drafters import next_draft_length
from genpool_worker.engine_io import Arrival, StepResult
from genpool_worker.model.kv_cache import PrefillSpan
from genpool_worker.model_runner import TorchModelRunner
from genpool_worker.sampling_params import SamplingParams
from genpool_worker.speculative import DrafterModelError, NgramDrafter, SpeculativeConfig
from genpool_worker.synthetic import SyntheticKVCache

VOCAB = 16
EOS = 0


class FakeNetwork:
    """Logits of each input token: ``next_logits(token)`` (a function of that token only,
    so a forward over drafts and one-token decodes give the same numbers). Counts the
    forwards that verified drafts."""

    name = "fake"
    is_synthetic = True
    eos_token_ids = (EOS,)
    max_seq_len = 4096

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table  # [VOCAB, VOCAB]: row t is the logits after token t
        self.kv = SyntheticKVCache(self.name, num_blocks=4, block_size=16)
        self.draft_forwards = 0
        self.decodes = 0

    def runner(self, speculative: SpeculativeConfig | None) -> TorchModelRunner[torch.Tensor]:
        return TorchModelRunner(self, self.kv, speculative)

    def prefill_many(
        self, cache: torch.Tensor, spans: Sequence[PrefillSpan], *, all_positions: bool = False
    ) -> torch.Tensor:
        if all_positions:
            self.draft_forwards += 1
            return self.table[[t for span in spans for t in span.token_ids]]
        return self.table[[span.token_ids[-1] for span in spans]]

    def decode(self, cache: torch.Tensor, block_tables: Sequence[Sequence[int]],
               token_ids: list[int], positions: list[int]) -> torch.Tensor:  # fmt: skip
        self.decodes += 1
        return self.table[token_ids]


def cycle_table() -> torch.Tensor:
    """Greedy: 1 -> 2 -> ... -> 15 -> 1 (never EOS); every token has some probability."""
    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0))
    for token in range(VOCAB):
        table[token, token % (VOCAB - 1) + 1] += 6.0
    table[:, EOS] = -1e4  # requests end by length
    return table


def spec(k: int = 4, low: int = 1, high: int = 3) -> SpeculativeConfig:
    return SpeculativeConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_min=low,
                             prompt_lookup_max=high)  # fmt: skip


def generate(
    network: FakeNetwork,
    speculative: SpeculativeConfig | None,
    arrivals: list[Arrival],
) -> tuple[dict[str, list[int]], list[StepResult]]:
    """Every arrival decoded to its end through the worker's scheduler and the runner, as
    the engine drives them (no KV budget: the fake network keeps no KV)."""
    k = 0 if speculative is None else speculative.num_speculative_tokens
    scheduler = GenScheduler.from_settings(
        {}, GenCapacity(8), SchedulerConfig(num_speculative_tokens=k)
    )
    runner = network.runner(speculative)
    for arrival in arrivals:
        runner.add_request(arrival)
        scheduler.add_request(GenRequest(arrival.request_id, len(arrival.prompt_ids),
                                         arrival.max_tokens, num_output_tokens=0), 0.0)  # fmt: skip
    out: dict[str, list[int]] = {a.request_id: [] for a in arrivals}
    results: list[StepResult] = []
    now = 0.0
    while scheduler.num_residents or scheduler.num_waiting:
        plan = scheduler.step(now)
        for request_id in plan.finished_ids:
            runner.remove_request(request_id)
        result = runner.execute(plan) if plan.batch_ids else StepResult({})
        results.append(result)
        counts, stops = {}, []
        for request_id, token in result.tokens.items():
            emitted = [*result.accepted.get(request_id, ()), token]
            out[request_id] += emitted
            counts[request_id] = len(emitted)
            if token == EOS:
                stops.append(request_id)
        now += 1.0
        drafts = {rid: d for rid, d in result.drafts.items() if rid in result.tokens}
        scheduler.postprocess(plan, now, tuple(stops), counts, drafts=drafts)
    return out, results


def arrival(
    request_id: str, prompt: list[int], max_tokens: int, min_tokens: int = 0, **sampling: object
) -> Arrival:
    return Arrival(request_id, prompt, max_tokens, SamplingParams(**sampling),  # type: ignore[arg-type]
                   min_tokens=min_tokens)  # fmt: skip


PROMPTS = {"a": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 1, 2],
           "b": [7, 3, 9, 9, 4], "c": [5, 6, 7, 8, 5, 6]}  # fmt: skip


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0.0}, {"temperature": 0.0, "repetition_penalty": 1.3},
     {"temperature": 1.0, "seed": 7}, {"temperature": 0.8, "top_p": 0.9, "seed": 3,
                                       "frequency_penalty": 0.5}],
    ids=["greedy", "greedy-penalised", "seeded", "seeded-filtered-penalised"],
)  # fmt: skip
def test_what_is_emitted_equals_decoding_without_speculation(sampling: dict[str, object]) -> None:
    """Each position's draw is the request's own sampler's, one draw per emitted token,
    so even a seeded sampled request emits exactly what it would without drafts."""
    arrivals = [arrival(rid, prompt, 40, **sampling) for rid, prompt in PROMPTS.items()]
    plain, _ = generate(FakeNetwork(cycle_table()), None, arrivals)
    network = FakeNetwork(cycle_table())
    drafted, results = generate(network, spec(), arrivals)
    assert drafted == plain and all(len(t) == 40 for t in plain.values())
    assert network.draft_forwards > 0
    if sampling["temperature"] == 0.0 and "repetition_penalty" not in sampling:
        # The cycle is in a's prompt: after its first token every draft is accepted.
        steps = sum(1 for r in results if "a" in r.tokens)
        assert steps <= 2 + math.ceil(39 / 5)


def assert_distributed_as(
    logits: torch.Tensor, emitted: dict[str, list[int]], results: list[StepResult]
) -> None:
    """The emitted tokens are distributed as ``softmax(logits)`` (chi-square, 15 degrees
    of freedom, p = 0.001), and enough drafts were accepted that verification's accept
    and reject paths both ran."""
    counts = Counter(t for tokens in emitted.values() for t in tokens)
    total = sum(counts.values())
    p = torch.softmax(logits, dim=-1)
    chi2 = sum((counts[t] - total * float(p[t])) ** 2 / (total * float(p[t]))
               for t in range(1, VOCAB))  # fmt: skip
    assert chi2 < 37.7, f"chi-square {chi2:.1f} over {total} tokens"
    assert sum(len(a) for r in results for a in r.accepted.values()) > total // 20


def test_rejection_sampling_keeps_the_target_distribution() -> None:
    """A network whose next-token distribution p ignores the context, drafts from a
    prompt that keeps proposing a likely token: the emitted tokens, drafts accepted or
    not, are distributed as p (chi-square, 15 degrees of freedom, p = 0.001)."""
    logits = torch.linspace(2.0, -2.0, VOCAB)
    logits[EOS] = -1e4  # never ends early
    network = FakeNetwork(logits.repeat(VOCAB, 1))
    prompt = [1, 2, 1, 2, 1, 2, 1, 2]
    arrivals = [arrival(f"r{i}", prompt, 64, temperature=1.0, seed=i) for i in range(40)]
    emitted, results = generate(network, spec(k=3, low=1, high=2), arrivals)
    assert_distributed_as(logits, emitted, results)


def test_a_stop_token_ends_the_run_and_min_tokens_masks_it() -> None:
    table = cycle_table()
    table[5] = -1e4
    table[5, EOS] = 10.0  # after 5 comes EOS
    prompt = [1, 2, 3, 4, 5, EOS, 1, 2, 3]
    network = FakeNetwork(table)
    out, _ = generate(network, spec(), [arrival("a", prompt, 12, temperature=0.0)])
    assert out["a"] == [4, 5, EOS]
    out, _ = generate(network, spec(), [arrival("a", prompt, 8, temperature=0.0, min_tokens=4)])
    plain, _ = generate(network, None, [arrival("a", prompt, 8, temperature=0.0, min_tokens=4)])
    assert out == plain and EOS not in out["a"][:4]


def test_a_request_its_stop_token_ended_drafts_nothing_more() -> None:
    table = cycle_table()
    table[5] = -1e4
    table[5, EOS] = 10.0  # after 5 comes EOS
    prompt = [1, 2, 3, 4, 5, EOS, 1, 2, 3]
    _, results = generate(FakeNetwork(table), spec(), [arrival("a", prompt, 12, temperature=0.0)])
    (ended,) = [r for r in results if r.tokens.get("a") == EOS]
    assert "a" in results[0].drafts  # it drafted while running
    assert "a" not in ended.drafts


class ForgetfulRunner(TorchModelRunner[torch.Tensor]):
    """The specification's bug: drafter state freed for every request missing from the
    batch, so a resumed request drafts from an empty context, as a fresh arrival."""

    def execute(self, plan: GenPlan, kv: object = None) -> StepResult:  # type: ignore[override]
        for request_id in plan.paused_in_place_ids:
            state = self._states[request_id]
            if state.drafter is not None:
                state.drafter = NgramDrafter([], 1, 3)
        return super().execute(plan)


Ids = tuple[str, ...]


class HandDriven:
    """A runner driven by hand-made plans, each stating the drafts the runner proposed for
    its members after their last step, as the scheduler does."""

    def __init__(self, runner: TorchModelRunner[torch.Tensor]) -> None:
        self.runner = runner
        self.proposed: dict[str, list[int]] = {}

    def run(
        self, batch: Ids, prefill: Ids = (), paused: Ids = (), admitted: Ids = ()
    ) -> StepResult:
        drafts = tuple(() if r in prefill else tuple(self.proposed.get(r, ())) for r in batch)
        plan = GenPlan(0.0, batch, tuple(range(len(batch))), prefill, paused,
                       tuple(range(len(paused))), admitted, tuple(() for _ in admitted), (),
                       (), (), (), drafts=drafts)  # fmt: skip
        result = self.runner.execute(plan)
        self.proposed.update({r: result.drafts.get(r, []) for r in batch})
        return result


def resumed_run(runner_class: type[TorchModelRunner[torch.Tensor]]) -> tuple[int, int, int]:
    """``a`` decodes a repeating pattern only its own output taught it, is paused for
    three steps while ``b`` runs, and resumes: (drafts accepted in its first and second
    steps back, tokens its drafter held when it resumed)."""
    table = torch.full((VOCAB, VOCAB), -1e4)
    for token, following in ((9, 3), (3, 12), (12, 6), (6, 9)):  # 9 3 12 6 9 3 ...
        table[token, following] = 0.0
    table[14, 9] = 0.0
    network = FakeNetwork(table)
    driven = HandDriven(runner_class(network, network.kv, spec(k=3, low=2, high=2)))
    driven.runner.add_request(arrival("a", [14], 60, temperature=0.0))
    driven.runner.add_request(arrival("b", [14], 60, temperature=0.0))
    driven.run(("a",), prefill=("a",), admitted=("a",))
    for _ in range(6):  # a's output 9 3 12 6 9 3 ...: its drafter learns the cycle from it
        driven.run(("a",))
    driven.run(("b",), prefill=("b",), paused=("a",), admitted=("b",))
    for _ in range(2):
        driven.run(("b",), paused=("a",))
    state = driven.runner._states["a"]
    assert state.drafter is not None
    held = state.drafter.num_tokens
    first = driven.run(("a", "b"))  # the drafts proposed before its pause
    second = driven.run(("a", "b"))  # drafts proposed from its drafter, after the pause
    return len(first.accepted.get("a", ())), len(second.accepted.get("a", ())), held


def test_a_resumed_request_drafts_from_its_history_before_the_pause() -> None:
    # Back in the batch, it verifies the drafts proposed before its pause, then drafts
    # from its drafter, which holds its prompt and its whole output.
    accepted_first, accepted_second, held = resumed_run(TorchModelRunner)
    assert (accepted_first, accepted_second) == (3, 3) and held > 8
    # The test catches the bug: a drafter reset while paused proposes nothing on return
    # (its pre-pause drafts, kept by the scheduler, are still verified).
    assert resumed_run(ForgetfulRunner) == (3, 0, 0)


class LayeredFakeNetwork(FakeNetwork):
    """A fake network whose first layers guess the next token from their own logits,
    ``draft_table`` (the early-exit drafter's view: right after most tokens, wrong after
    some). Counts the drafting forwards."""

    num_layers = 4

    def __init__(self, table: torch.Tensor, draft_table: torch.Tensor) -> None:
        super().__init__(table)
        self.draft_table = draft_table
        self.draft_steps = 0

    def decode(self, cache: torch.Tensor, block_tables: Sequence[Sequence[int]],
               token_ids: list[int], positions: list[int], *,
               num_layers: int | None = None) -> torch.Tensor:  # fmt: skip
        if num_layers is None:
            return self.table[token_ids]
        assert num_layers == 2
        self.draft_steps += 1
        return self.draft_table[token_ids]


def early_exit(k: int = 3, layers: int = 2) -> SpeculativeConfig:
    return SpeculativeConfig(method="early_exit", num_speculative_tokens=k,
                             num_draft_layers=layers)  # fmt: skip


def shallow_guess(table: torch.Tensor) -> torch.Tensor:
    """``table`` with the greedy follower of tokens 3 and 8 guessed wrong."""
    guess = table.clone()
    guess[3, 9] += 40.0
    guess[8, 2] += 40.0
    return guess


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0.0}, {"temperature": 0.0, "repetition_penalty": 1.3},
     {"temperature": 0.8, "top_p": 0.9, "seed": 3, "frequency_penalty": 0.5}],
    ids=["greedy", "greedy-penalised", "seeded-filtered-penalised"],
)  # fmt: skip
def test_early_exit_drafts_emit_what_decoding_without_speculation_does(
    sampling: dict[str, object],
) -> None:
    arrivals = [arrival(rid, prompt, 40, **sampling) for rid, prompt in PROMPTS.items()]
    plain, _ = generate(FakeNetwork(cycle_table()), None, arrivals)
    network = LayeredFakeNetwork(cycle_table(), shallow_guess(cycle_table()))
    drafted, results = generate(network, early_exit(), arrivals)
    assert drafted == plain and network.draft_steps > 0 and network.draft_forwards > 0
    num_drafted = sum(sum(r.drafted.values()) for r in results)
    num_accepted = sum(len(a) for r in results for a in r.accepted.values())
    assert 0 < num_accepted < num_drafted  # the wrong guesses are rejected, the others kept


def test_early_exit_rejection_sampling_keeps_the_target_distribution() -> None:
    """Drafts from a distribution unlike the target's (the first layers' argmax, always
    token 1): the emitted tokens are still distributed as the target's p."""
    logits = torch.linspace(2.0, -2.0, VOCAB)
    logits[EOS] = -1e4
    guess = torch.zeros(VOCAB, VOCAB)
    guess[:, 1] = 1.0  # the likeliest token: accepted often, rejected often too
    network = LayeredFakeNetwork(logits.repeat(VOCAB, 1), guess)
    arrivals = [arrival(f"r{i}", [3, 4], 64, temperature=1.0, seed=i) for i in range(40)]
    emitted, results = generate(network, early_exit(), arrivals)
    assert_distributed_as(logits, emitted, results)


def test_early_exit_needs_a_layered_network_with_layers_to_spare() -> None:
    with pytest.raises(DrafterModelError, match="needs a layered network"):
        FakeNetwork(cycle_table()).runner(early_exit())
    network = LayeredFakeNetwork(cycle_table(), cycle_table())
    with pytest.raises(DrafterModelError, match="below the model's 4 layers, got 4"):
        network.runner(early_exit(layers=4))


def test_a_pass_with_drafts_is_one_forward_for_every_member() -> None:
    """``a`` drafts (its prompt holds the cycle), ``b`` finds nothing to look up, and
    ``c`` asks for logprobs: ``b`` rides in the drafts' forward as a one-token row, and
    only ``c`` decodes on its own."""
    network = FakeNetwork(cycle_table())
    driven = HandDriven(network.runner(spec()))
    driven.runner.add_request(arrival("a", PROMPTS["a"], 20, temperature=0.0))
    driven.runner.add_request(arrival("b", [7, 3, 9, 9, 4], 20, temperature=0.0))
    driven.runner.add_request(arrival("c", [7, 3, 9, 9, 4], 20, temperature=0.0,
                                      num_logprobs=1))  # fmt: skip
    everyone = ("a", "b", "c")
    first = driven.run(everyone, prefill=everyone, admitted=everyone)
    assert set(first.drafts) == {"a"}  # b has nothing to look up, c asks for logprobs
    network.decodes = 0
    result = driven.run(everyone)
    assert set(result.tokens) == set(everyone) and network.draft_forwards == 1
    assert result.drafted == {"a": 4} and len(result.accepted["a"]) == 4
    assert network.decodes == 1 and set(result.logprobs) == {"c"}
    result = driven.run(("b",))  # alone and draftless: a decode
    assert network.decodes == 2 and not result.drafted


@pytest.mark.parametrize(
    ("length", "drafted", "accepted", "after"),
    [(4, 4, 4, 4), (2, 2, 2, 4), (1, 1, 1, 3), (3, 3, 2, 2), (1, 1, 0, 1), (4, 0, 0, 4)],
)
def test_a_draft_length_climbs_on_success_and_falls_on_a_miss(
    length: int, drafted: int, accepted: int, after: int
) -> None:
    assert next_draft_length(length, drafted, accepted, k=4) == after


def test_failing_drafts_shrink_to_one_a_step() -> None:
    """A target that draws uniformly: prompt lookup's drafts are accepted about one time
    in fifteen, so the request soon drafts about one token a step instead of k."""
    logits = torch.zeros(VOCAB)
    logits[EOS] = -1e4
    network = FakeNetwork(logits.repeat(VOCAB, 1))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    request = arrival("a", prompt, 60, temperature=1.0, seed=1)
    _, results = generate(network, spec(k=4, low=1, high=1), [request])
    drafted = [r.drafted["a"] for r in results if "a" in r.drafted]
    assert drafted[0] == 4 and 1 in drafted and sum(drafted) / len(drafted) < 2, drafted
