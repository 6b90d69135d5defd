"""The simulator knows prefixes: conversation workloads with synthesized block hashes,
GEN workers that prefill their own prompts after the cached tokens, the oracle hit rate,
the CLI's flags (docs/sim.md#prefix-caching)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from genpool_core.block_hash import block_hashes
from genpool_core.plan import GenPlan
from genpool_core.request import GenRequest
from genpool_core.scheduler import GenScheduler
from genpool_core.stepmodel import StepModel
from genpool_sim.cli import main
from genpool_sim.cluster import Cluster, ClusterConfig
from genpool_sim.conversations import (
    Conversation,
    ConversationSettings,
    Turn,
    draw_conversations,
    run_conversations,
)
from genpool_sim.experiment import Workload, measure, simulate
from genpool_sim.gen_pass import PREFIX_AWARE, pass_seconds
from genpool_sim.prefix_metrics import oracle_hits, prefix_metrics
from genpool_sim.records import SimRequest
from genpool_sim.workload import TraceRequest
from tests.unit.support import check_invariants, write_small_trace

LENGTHS = [TraceRequest(0.0, 200 + 37 * i % 500, 20 + 53 * i % 200) for i in range(100)]
MODEL = StepModel(t0_s=0.02, per_request_s=0.001, per_context_token_s=1e-6,
                  prefill_base_s=0.01, prefill_per_token_s=1e-4)  # fmt: skip
ROOMY = ClusterConfig(workers=1, max_batch=8, colocated=True, step_model=MODEL,
                      kv_blocks=20_000, prefix_caching=True)  # fmt: skip
SETTINGS = ConversationSettings(0.5, system_prompt_tokens=100, turns=4.0, think_s=2.0)


def _workload(settings: ConversationSettings = SETTINGS, duration_s: float = 60.0) -> Workload:
    return Workload(LENGTHS, conversations=settings, duration_s=duration_s, warmup_s=5.0)


def test_equal_prefixes_hash_equal_and_conversations_part_after_the_system_prompt() -> None:
    turns = (Turn(40, 30, 0.0), Turn(20, 25, 1.0))
    a, b = Conversation(0, 0.0, 0, 64, turns), Conversation(1, 0.0, 0, 64, turns)
    c = Conversation(2, 0.0, 1, 64, turns)  # another system prompt
    ha, hb, hc = a.block_hashes(16), b.block_hashes(16), c.block_hashes(16)
    assert len(ha) == a.num_tokens // 16 == (64 + 40 + 30 + 20 + 25) // 16
    assert ha[:4] == hb[:4] and ha[4] != hb[4]  # 64 system tokens: 4 shared blocks
    assert not set(hc) & set(ha)
    assert ha == block_hashes(a.token_ids(), 16)  # the product's chain, over its tokens
    assert a.prompt_tokens(1) == 64 + 40 + 30 + 20


def test_conversations_are_drawn_per_seed_and_fit_the_context() -> None:
    settings = replace(SETTINGS, max_context_tokens=900)
    first = draw_conversations(settings, 1.0, 300.0, LENGTHS, random.Random(3))
    assert first == draw_conversations(settings, 1.0, 300.0, LENGTHS, random.Random(3))
    assert first != draw_conversations(settings, 1.0, 300.0, LENGTHS, random.Random(4))
    assert 100 < len(first) < 200  # about 0.5 a second
    assert all(c.num_tokens <= 900 and c.turns[0].think_s == 0 for c in first)
    assert sum(len(c.turns) for c in first) / len(first) > 1.5


def test_a_later_turn_hits_the_earlier_turns_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    original = GenScheduler.step

    def checked_step(self: GenScheduler, now: float) -> GenPlan:
        plan = original(self, now)
        check_invariants(self)  # shared blocks: each holder counted in the reference count
        return plan

    monkeypatch.setattr(GenScheduler, "step", checked_step)
    cluster = simulate(ROOMY, _workload(), 1)
    requests = list(cluster.requests.values())
    assert all(r.is_done for r in requests)
    later = [r for r in requests if r.turn is not None and r.turn >= 2]
    assert len(later) > 10
    # one worker, no eviction: every admission finds what the oracle says was computed,
    # the whole history (its previous prompt and reply) for a later turn
    oracle = oracle_hits(requests, 16)
    assert all(r.cached_tokens == oracle[r.request_id] for r in requests)
    previous = {(r.conversation, r.turn): r for r in requests}
    for r in later:
        before = previous[(r.conversation, (r.turn or 0) - 1)]
        written = before.prompt_tokens + before.output_tokens - 1
        assert r.cached_tokens == min(written // 16, (r.prompt_tokens - 1) // 16) * 16
    assert cluster.workers[0].scheduler.kv.num_used == 0


def test_caching_off_gives_no_hits_and_the_same_conversations() -> None:
    on = simulate(ROOMY, _workload(), 2)
    off = simulate(replace(ROOMY, prefix_caching=False), _workload(), 2)
    # the same conversations; faster replies may fit more turns before the end
    shape = {(r.request_id, r.prompt_tokens, r.output_tokens) for r in off.requests.values()}
    assert shape <= {(r.request_id, r.prompt_tokens, r.output_tokens)
                     for r in on.requests.values()}  # fmt: skip
    assert all(r.cached_tokens == 0 for r in off.requests.values())
    metrics, _ = measure(off, _workload(), None)
    assert metrics["prefix_hit_rate"] == 0 and metrics["prefix_oracle_hit_rate"] > 0.5
    on_metrics, _ = measure(on, _workload(), None)
    assert on_metrics["prefix_hit_rate"] == pytest.approx(metrics["prefix_oracle_hit_rate"], 0.02)
    assert on_metrics["ttft_turns2_p50"] < metrics["ttft_turns2_p50"]


def test_a_prefill_after_cached_tokens_costs_only_the_uncached_ones() -> None:
    requests = {
        name: SimRequest(name, 0.0, prompt, 50) for name, prompt in (("a", 500), ("b", 300))
    }
    requests["a"].gen = GenRequest("a", 500, 50, num_output_tokens=0)
    requests["b"].gen = GenRequest("b", 300, 50, num_output_tokens=7)
    plan = GenPlan(now=0.0, batch_ids=("b", "a"), batch_slots=(0, 1), prefill_ids=("a",),
                   paused_in_place_ids=(), paused_in_place_slots=(), admitted_ids=("a",),
                   admitted_blocks=((),), resumed_ids=(), paused_ids=(), finished_ids=(),
                   finish_reasons=(), admitted_cached_tokens=(320,))  # fmt: skip
    decode = MODEL.decode_step_time(1, 307)  # b decodes; a's token comes from its prefill
    assert pass_seconds(MODEL, plan, requests, {}) == pytest.approx(
        decode + MODEL.prefill_time(500 - 320)
    )
    uncached = replace(plan, admitted_cached_tokens=(0,))
    assert pass_seconds(MODEL, uncached, requests, {}) == pytest.approx(
        decode + MODEL.prefill_time(500)
    )


def test_an_idle_workers_second_turn_waits_only_for_its_uncached_prefill() -> None:
    cluster = Cluster(ROOMY)
    conversation = Conversation(0, 0.0, 0, 64, (Turn(100, 20, 0.0), Turn(50, 10, 3.0)))
    run_conversations(cluster, [conversation], 60.0, cluster.submit)
    first, second = cluster.requests["v0-1"], cluster.requests["v0-2"]
    assert first.cached_tokens == 0 and second.cached_tokens == (164 + 19) // 16 * 16
    assert second.ttft == pytest.approx(MODEL.prefill_time(second.prompt_tokens - 176))
    assert first.ttft == pytest.approx(MODEL.prefill_time(first.prompt_tokens))


def test_the_oracle_counts_whole_blocks_computed_earlier_leaving_one_token() -> None:
    def request(name: str, at: float, prompt: int, output: int, hashes: str) -> SimRequest:
        r = SimRequest(name, at, prompt, output)
        r.block_hashes = [ord(h) for h in hashes]
        return r

    trace = [
        request("late", 3.0, 8, 2, "ax"),  # 8 tokens: block x is its last, never hit
        request("first", 0.0, 9, 4, "abc"),  # computes a, b (prompt) and c (reply)
        request("second", 1.0, 14, 1, "abc"),  # 13 tokens to hit: a, b, c
        request("other", 2.0, 12, 5, "yzw"),
    ]
    assert oracle_hits(trace, 4) == {"first": 0, "second": 12, "other": 0, "late": 4}
    metrics = prefix_metrics(trace[:3], trace, 4)
    assert metrics["prefix_oracle_hit_rate"] == pytest.approx(16 / (8 + 9 + 14))
    assert metrics["prefix_hit_rate"] == 0


def test_prefix_aware_routing_finds_the_history_on_many_workers() -> None:
    config = replace(ROOMY, workers=4)
    aware = simulate(replace(config, router=PREFIX_AWARE), _workload(), 5)
    loaded = simulate(config, _workload(), 5)
    hits = [sum(r.cached_tokens for r in c.requests.values()) for c in (aware, loaded)]
    assert hits[0] > hits[1] > 0


def test_cli_runs_conversations_with_caching_off_and_on(tmp_path: Path) -> None:
    trace = write_small_trace(tmp_path / "trace.csv")
    out = tmp_path / "out.json"
    code = main(["sim", "--trace", str(trace), "--conversations", "0.5", "--colocated",
                 "--kv-blocks", "2000", "--prefix-caching", "off,on", "--workers", "2",
                 "--modes", "off", "--seeds", "1", "--jobs", "1", "--duration", "60",
                 "--warmup", "5", "--system-prompt-tokens", "256", "--json", str(out)])  # fmt: skip
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert [run["scenario"] for run in runs] == [
        "conversations 0.5/s cv=1.0, prefix caching off",
        "conversations 0.5/s cv=1.0, prefix caching on",
    ]
    rates = [run["summary"]["off"]["prefix_hit_rate"]["mean"] for run in runs]
    assert rates[0] == 0 < rates[1]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prefix-caching", "on", "--kv-blocks", "2000"], "needs --colocated"),
        (["--prefix-caching", "on", "--colocated"], "needs --kv-blocks"),
        (["--conversations", "0", "--colocated"], "--conversations: conversation rate"),
        (["--conversations", "1", "--conv-max-context", "9000", "--kv-blocks", "500"],
         "cannot hold a turn"),
        (["--conversations", "1", "--autoscale", "--slo-ttft-p90", "1",
          "--target-output-tps", "10"], "--autoscale runs the context stage"),
    ],
)  # fmt: skip
def test_cli_refuses_what_it_does_not_model(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_small_trace(tmp_path / "trace.csv")
    assert main(["sim", "--trace", str(trace), "--seeds", "1", *flags]) == 2
    assert message in capsys.readouterr().err
