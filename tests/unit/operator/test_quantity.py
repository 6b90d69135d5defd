"""Resource quantities as whole units: exact values, Kubernetes' rounding, and a parser
that answers anything with an int or a QuantityError, quickly."""

from __future__ import annotations

import math
import re
from decimal import Decimal, localcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genpool_operator.quantity import (
    MAX_EXPONENT,
    POSITIVE_QUANTITY,
    QUANTITY,
    QuantityError,
    is_quantity,
    quantity_value,
)

BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8Gi", 8 * 2**30), ("512Mi", 512 * 2**20), ("1Ki", 1024), ("1Ei", 2**60),
        ("1.5Gi", 3 * 2**29), ("0.5Ki", 512), (".5Mi", 2**19), ("2.", 2),
        ("1G", 10**9), ("1.5G", 1_500_000_000), ("2k", 2000), ("1E", 10**18),
        ("1e9", 10**9), ("1E3", 1000), ("1e+3", 1000), ("12e0", 12), ("+4Gi", 4 * 2**30),
        ("8589934592", 8589934592), ("0", 0),
        # Quantity.Value() rounds up, away from zero
        ("100m", 1), ("1500m", 2), ("1e-3", 1), ("1.0001", 2), ("-1.5", -2), ("-1Gi", -(2**30)),
    ],
)  # fmt: skip
def test_quantities_read_exactly(text: str, value: int) -> None:
    assert quantity_value(text) == value


def test_an_int_is_itself() -> None:
    assert quantity_value(8589934592) == 8589934592


@pytest.mark.parametrize(
    "value",
    ["", "8GB", "8 Gi", "Gi", "8gi", "1..2", "1e", "--1", "8Gi\n", " 8Gi", "1Ki1",
     "1e2.5", "1e100", "1e-100", "1" * 129, None, 1.5, True, [1], {"a": 1}],
)  # fmt: skip
def test_anything_else_is_a_quantity_error(value: object) -> None:
    with pytest.raises(QuantityError):
        quantity_value(value)


def test_an_exponent_too_large_is_refused_at_once() -> None:
    # The CRD's pattern lets it through; computing it would take a billion digits.
    with pytest.raises(QuantityError, match="exponent is beyond"):
        quantity_value("1e999999999")


def oracle(text: str) -> int:
    """An independent reading: Decimal for the number, the suffix tables above."""
    with localcontext(prec=500):  # exact for every quantity these tests generate
        binary = [suffix for suffix in BINARY if text.endswith(suffix)]
        if binary:
            exact = Decimal(text.removesuffix(binary[0])) * 2 ** BINARY[binary[0]]
        elif text[-1] in "numkMGTPE":  # a lone E is exa; an exponent ends in a digit
            exact = Decimal(text[:-1]).scaleb(DECIMAL[text[-1]])
        else:
            exact = Decimal(text)  # digits, perhaps with an e/E exponent
        rounded = math.ceil(abs(exact))  # abs() rounds to the context's precision too
    return -rounded if exact < 0 else rounded


# Quantities without an e/E exponent (those are the next test's): any number, any suffix.
READABLE = st.from_regex(QUANTITY, fullmatch=True).filter(
    lambda q: re.search(r"[eE][+-]?[0-9.]+$", q) is None
)


@settings(max_examples=300, deadline=None)
@given(READABLE)
def test_every_readable_quantity_agrees_with_an_independent_reading(text: str) -> None:
    assert quantity_value(text) == oracle(text)


@settings(max_examples=200, deadline=None)
@given(st.integers(-MAX_EXPONENT, MAX_EXPONENT), st.integers(0, 10**6))
def test_exponents_within_the_bound_are_exact(exponent: int, mantissa: int) -> None:
    assert quantity_value(f"{mantissa}e{exponent}") == oracle(f"{mantissa}e{exponent}")


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=80), st.from_regex(QUANTITY, fullmatch=True)))
def test_any_text_is_an_int_or_a_quantity_error(text: str) -> None:
    try:
        value = quantity_value(text)
    except QuantityError:
        return
    assert isinstance(value, int) and is_quantity(text)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(POSITIVE_QUANTITY, fullmatch=True))
def test_a_positive_quantity_is_a_quantity_of_at_least_one(text: str) -> None:
    assert is_quantity(text)
    assert quantity_value(text) >= 1
