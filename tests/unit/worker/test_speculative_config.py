"""``--speculative-config`` (vLLM's JSON, checked) and the n-gram drafter, against a
brute-force prompt lookup over the whole history."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genpool_worker.speculative import (
    NgramDrafter,
    SpecDecodeCounts,
    parse_speculative_config,
)


def lookup(history: list[int], k: int, low: int, high: int) -> list[int]:
    """vLLM's ngram proposal, brute force: the longest suffix (``high`` down to ``low``)
    seen earlier, its latest earlier occurrence, and what followed it."""
    for n in range(min(high, len(history) - 1), low - 1, -1):
        suffix = history[-n:]
        for end in range(len(history) - 1, n - 1, -1):
            if history[end - n : end] == suffix:
                return history[end : end + k]
    return []


@given(
    prompt=st.lists(st.integers(0, 3), max_size=30),
    output=st.lists(st.integers(0, 3), max_size=30),
    sizes=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    k=st.integers(0, 5),
)
def test_the_index_proposes_what_a_full_scan_finds(
    prompt: list[int], output: list[int], sizes: tuple[int, int], k: int
) -> None:
    low, high = sizes[0], sizes[0] + sizes[1]
    drafter = NgramDrafter(prompt, low, high)
    history = list(prompt)
    for token in output:  # extended token by token, as a request's output comes
        assert drafter.propose(k) == lookup(history, k, low, high)
        drafter.extend([token])
        history.append(token)
    assert drafter.propose(k) == lookup(history, k, low, high)
    assert drafter.num_tokens == len(history)


def test_a_repeated_pattern_is_proposed_and_a_new_one_is_not() -> None:
    drafter = NgramDrafter([5, 6, 7, 8, 9, 5, 6], 1, 3)
    assert drafter.propose(3) == [7, 8, 9]
    drafter.extend([42])
    assert drafter.propose(3) == []


def test_config_defaults_and_lookup_sizes_follow_vllm() -> None:
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert config.num_speculative_tokens == 3 and config.lookup_range == (5, 5)
    only_max = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}'
    assert parse_speculative_config(only_max).lookup_range == (4, 4)
    both = ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4,'
            ' "prompt_lookup_min": 2}')  # fmt: skip
    assert parse_speculative_config(both).lookup_range == (2, 4)
    early = '{"method": "early_exit", "num_speculative_tokens": 3, "num_draft_layers": 10}'
    assert parse_speculative_config(early).num_draft_layers == 10


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"num_speculative_tokens": 2}', "method: Field required"),
        ('{"method": "eagle", "num_speculative_tokens": 2}',
         "method: Input should be 'ngram' or 'early_exit'"),
        ('{"method": "early_exit", "num_speculative_tokens": 2}',
         "early_exit needs num_draft_layers"),
        ('{"method": "early_exit", "num_speculative_tokens": 2, "num_draft_layers": 0}',
         "num_draft_layers: Input should be greater than or equal to 1"),
        ('{"method": "early_exit", "num_speculative_tokens": 2, "num_draft_layers": 3,'
         ' "prompt_lookup_max": 2}', "prompt_lookup_min/max are options of method ngram only"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "num_draft_layers": 3}',
         "num_draft_layers is an option of method early_exit only"),
        ('{"method": "ngram"}', "num_speculative_tokens: Field required"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "greater than or equal to 1"),
        ('{"method": "ngram", "num_speculative_tokens": 99}', "less than or equal to 16"),
        ('{"method": "ngram", "num_speculative_tokens": "4"}', "valid integer"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}', "model: Extra"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5,'
         ' "prompt_lookup_max": 2}', "prompt_lookup_min (5) is above prompt_lookup_max (2)"),
    ],
)  # fmt: skip
def test_a_bad_config_is_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="--speculative-config") as raised:
        parse_speculative_config(text)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_counts_add_up_by_position() -> None:
    counts = SpecDecodeCounts()
    assert counts.acceptance_rate is None
    counts.count({"a": 4, "b": 2}, {"a": [1, 2, 3]})
    counts.count({"a": 4}, {"a": [7]})
    assert (counts.num_drafts, counts.num_draft_tokens, counts.num_accepted_tokens) == (3, 10, 4)
    assert counts.accepted_per_position == [2, 1, 1]
    assert counts.acceptance_rate == pytest.approx(0.4)


def test_the_worker_config_takes_the_flag_as_text_or_object_and_sizes_the_scheduler() -> None:
    from genpool_worker.worker_config import WorkerConfig, build_scheduler

    spec = {"method": "ngram", "num_speculative_tokens": 3}
    for value in (spec, '{"method": "ngram", "num_speculative_tokens": 3}'):
        config = WorkerConfig.model_validate({"model": "synthetic:x", "speculative_config": value})
        assert config.speculative() is not None
        assert build_scheduler(config).config.num_speculative_tokens == 3
    plain = WorkerConfig.model_validate({"model": "synthetic:x"})
    assert plain.speculative() is None and build_scheduler(plain).config.num_speculative_tokens == 0
    with pytest.raises(ValueError, match="--speculative-config: method"):
        WorkerConfig.model_validate({"model": "synthetic:x", "speculative_config": {"k": 1}})
