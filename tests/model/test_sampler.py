"""The batched sampler (docs/worker.md#sampling): greedy is argmax, seeded draws follow
the filtered softmax (a chi-square test on a small vocabulary: seeded, so it cannot flake),
penalties equal a reference computation, logprobs equal ``log_softmax`` of the logits, and
a row's draw does not depend on the rest of the batch."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from genpool_worker.model.sampler import SampleRow, _penalised, sample
from genpool_worker.sampling_params import SamplingParams

LOGITS = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
DRAWS = 4000
CHI2_DF3_P001 = 16.27  # the chi-square value a 3-degree-of-freedom fit exceeds 0.1% of the time
CHI2_DF1_P001 = 10.83


def row(seed: int = 0, **params: object) -> SampleRow:
    sampling = SamplingParams(**params)  # type: ignore[arg-type]
    generator = None if sampling.is_greedy else torch.Generator().manual_seed(seed)
    return SampleRow(sampling, generator, [], [])


def draws(r: SampleRow, logits: torch.Tensor = LOGITS, n: int = DRAWS) -> Counter[int]:
    return Counter(sample(logits[None, :], [r])[0][0] for _ in range(n))


def chi_square(counts: Counter[int], probs: list[float]) -> float:
    total = sum(counts.values())
    return sum((counts.get(i, 0) - total * p) ** 2 / (total * p) for i, p in enumerate(probs) if p)


def test_greedy_is_the_argmax_of_every_row() -> None:
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    tokens, logprobs = sample(logits, [row() for _ in range(5)])
    assert tokens == logits.argmax(dim=-1).tolist() and logprobs == [None] * 5


def test_temperature_one_draws_from_the_softmax() -> None:
    counts = draws(row(seed=7, temperature=1.0))
    assert chi_square(counts, [0.5, 0.3, 0.15, 0.05]) < CHI2_DF3_P001


def test_temperature_sharpens_the_distribution() -> None:
    probs = torch.softmax(LOGITS / 0.5, dim=-1).tolist()
    assert chi_square(draws(row(seed=8, temperature=0.5)), probs) < CHI2_DF3_P001


@pytest.mark.parametrize("params", [{"top_k": 2}, {"top_p": 0.7}, {"min_p": 0.4}])
def test_filters_keep_the_top_two_in_proportion(params: dict[str, object]) -> None:
    counts = draws(row(seed=9, temperature=1.0, **params))
    assert set(counts) == {0, 1}
    assert chi_square(counts, [0.5 / 0.8, 0.3 / 0.8]) < CHI2_DF1_P001


def test_the_same_seed_draws_the_same_tokens_whatever_the_batch() -> None:
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2))
    alone = [sample(logits[:1], [row(seed=5, temperature=1.0)])[0][0] for _ in range(1)]
    batched = sample(logits, [row(seed=5, temperature=1.0), row(), row(seed=6, temperature=0.7)])
    assert batched[0][0] == alone[0]
    first = [
        sample(logits[:1], [r])[0][0] for r in [row(seed=3, temperature=1.0)] for _ in range(20)
    ]
    again = [
        sample(logits[:1], [r])[0][0] for r in [row(seed=3, temperature=1.0)] for _ in range(20)
    ]
    assert first == again


def reference_penalties(logits: list[float], prompt: list[int], output: list[int],
                        p: SamplingParams) -> list[float]:  # fmt: skip
    out = []
    for token, value in enumerate(logits):
        if token in prompt or token in output:
            value = value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
        count = output.count(token)
        value -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
        out.append(value)
    return out


def test_penalties_equal_the_reference_computation() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -0.2, 1.5]])
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.25)
    prompt, output = [0, 1], [3, 3, 4]
    got = _penalised(logits.clone(), [SampleRow(params, None, prompt, output)])
    expected = reference_penalties(logits[0].tolist(), prompt, output, params)
    assert got[0].tolist() == pytest.approx(expected)


def test_a_penalty_changes_the_greedy_token() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0]] * 2)
    plain = SampleRow(SamplingParams(), None, [], [0])
    penalised = SampleRow(SamplingParams(frequency_penalty=0.5), None, [], [0])
    assert sample(logits, [plain, penalised])[0] == [0, 1]


def test_logprobs_are_log_softmax_of_the_logits() -> None:
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(4))
    rows = [row(num_logprobs=3), row(seed=1, temperature=1.0, num_logprobs=0)]
    tokens, logprobs = sample(logits, rows)
    reference = torch.log_softmax(logits, dim=-1)
    for i, (token, lp) in enumerate(zip(tokens, logprobs, strict=True)):
        assert lp is not None and math.isclose(lp.logprob, float(reference[i, token]), abs_tol=1e-5)
    values, ids = reference[0].topk(3)
    assert [t for t, _ in logprobs[0].top] == ids.tolist()  # type: ignore[union-attr]
    assert [v for _, v in logprobs[0].top] == pytest.approx(values.tolist(), abs=1e-5)  # type: ignore[union-attr]
    assert logprobs[1].top == ()  # type: ignore[union-attr]


def test_bad_params_are_refused_naming_the_field() -> None:
    for name, value in [("top_p", 0.0), ("top_k", -1), ("min_p", 1.5), ("temperature", 3.0),
                        ("repetition_penalty", 0.0), ("presence_penalty", 2.5)]:  # fmt: skip
        with pytest.raises(ValueError, match=name):
            SamplingParams(**{name: value})  # type: ignore[arg-type]


def test_a_temperature_below_1e_5_is_greedy_not_nan() -> None:
    # vLLM's rule: a temperature under 1e-5 is greedy. Dividing real logits by 1e-39
    # overflowed to inf and the softmax to NaN: the draw was not the argmax.
    logits = 10 * torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    for tiny in (1e-39, 1e-6):
        tokens, _ = sample(logits, [row(seed=i, temperature=tiny) for i in range(4)])
        assert tokens == logits.argmax(dim=-1).tolist()


def test_a_top_k_past_the_vocabulary_filters_nothing() -> None:
    huge = draws(row(seed=9, temperature=1.0, top_k=2**31 - 1), n=400)
    plain = draws(row(seed=9, temperature=1.0), n=400)
    assert huge == plain


def test_masked_tokens_are_never_drawn() -> None:
    # min_tokens (vLLM): EOS and the stop tokens are masked until that many are out.
    logits = torch.tensor([[5.0, 4.0, 1.0, 0.5]])
    greedy = SampleRow(SamplingParams(), None, [], [], masked_ids=(0, 1))
    assert sample(logits, [greedy])[0] == [2]
    drawn = SampleRow(SamplingParams(temperature=2.0), torch.Generator().manual_seed(1), [], [],
                      masked_ids=(0,))  # fmt: skip
    assert 0 not in {sample(logits, [drawn])[0][0] for _ in range(200)}


def test_penalty_counts_kept_across_passes_equal_a_recount_from_the_token_lists() -> None:
    generator = torch.Generator().manual_seed(5)
    params = SamplingParams(repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2)
    prompt = [1, 4, 4, 9]
    kept = SampleRow(params, None, prompt, [])
    output: list[int] = []
    for _ in range(40):
        logits = torch.randn(1, 12, generator=generator)
        recount = _penalised(logits, [SampleRow(params, None, prompt, list(output))])
        assert torch.equal(_penalised(logits, [kept]), recount)
        (token,), _ = sample(logits, [kept])
        kept.took(token)
        output.append(token)
    assert kept.output_ids == [] and kept.counts is not None  # counted once, then kept


def test_only_penalised_rows_change_and_the_logits_stay_as_they_were() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5], [1.0, 1.0, 1.0], [0.5, 3.0, -2.0]])
    before = logits.clone()
    rows = [row(), SampleRow(SamplingParams(presence_penalty=0.5), None, [], [1]), row()]
    got = _penalised(logits, rows)
    assert torch.equal(logits, before)
    assert torch.equal(got[0], before[0]) and torch.equal(got[2], before[2])
    assert got[1].tolist() == [1.0, 0.5, 1.0]
