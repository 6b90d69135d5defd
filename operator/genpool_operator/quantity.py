"""Kubernetes resource quantities (core/v1 ``resource.Quantity``) read as whole units (pure).

``QUANTITY`` is the CRD's pattern of a ``resources`` value and ``POSITIVE_QUANTITY`` that
of ``engine.kvCacheMemory`` (no sign, no sub-unit suffix, a non-zero digit, bounded
length): each pattern is written once here and the CRD test checks the CRD spells it the
same. ``quantity_value`` reads one the way ``Quantity.Value()`` does: exactly (integers and
fractions, never a float), rounded away from zero to a whole unit. Whatever it cannot
read raises ``QuantityError``, a ValueError, so inside a pydantic validator it becomes a
validation error; that includes an exponent beyond ``MAX_EXPONENT``, because the CRD's
pattern lets ``1e999999999`` through and computing it would take a billion digits.
"""

from __future__ import annotations

import re
from fractions import Fraction

# core/v1 resource.Quantity, as the CRD's pattern spells it.
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# A positive byte count: a mantissa with a non-zero digit, whole-unit suffixes only, a
# two-digit exponent at most; bounded, so the apiserver's check of it is cheap too.
POSITIVE_QUANTITY = re.compile(
    r"^([0-9]{0,20}[1-9][0-9]{0,20}(\.[0-9]{0,20})?|[0-9]{0,20}\.[0-9]{0,20}[1-9][0-9]{0,20})"
    r"([KMGTPE]i|[kMGTPE]|[eE][0-9]{1,2})?$"
)
MAX_QUANTITY_CHARS = 128  # far beyond any real quantity (and POSITIVE_QUANTITY's 65)
MAX_EXPONENT = 99  # 10^99 is beyond any memory (and POSITIVE_QUANTITY's two digits)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_PARTS = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)", re.DOTALL)


class QuantityError(ValueError):
    """A value that is not a resource quantity this module can read."""


def is_quantity(text: str) -> bool:
    """Whether ``text`` matches the CRD's pattern (whole text: no trailing newline)."""
    return QUANTITY.fullmatch(text) is not None


def quantity_value(value: object) -> int:
    """``value`` (an int, or a quantity string such as ``8Gi``, ``1.5G``, ``1e9``) as whole
    units, rounded away from zero like ``Quantity.Value()``; QuantityError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise QuantityError(f"{value!r} is not a resource quantity (an integer or a string)")
    if isinstance(value, int):
        return value
    if len(value) > MAX_QUANTITY_CHARS:
        raise QuantityError(f"{value[:16]!r}... is longer than {MAX_QUANTITY_CHARS} characters")
    if not is_quantity(value):
        raise QuantityError(f"{value!r} is not a resource quantity")
    parts = _PARTS.fullmatch(value)
    if parts is None:  # unreachable: every string is sign, digits, fraction, suffix
        raise QuantityError(f"{value!r} is not a resource quantity")
    sign, whole, fraction, suffix = parts.groups()
    digits = fraction or ""
    exact = Fraction(int(whole + digits or "0"), 10 ** len(digits)) * _multiplier(value, suffix)
    rounded = -(-exact.numerator // exact.denominator)  # ceil, exactly
    return -rounded if sign == "-" else rounded


def _multiplier(value: str, suffix: str) -> Fraction:
    if suffix in _BINARY:
        return Fraction(_BINARY[suffix])
    if suffix in _DECIMAL:
        return Fraction(10) ** _DECIMAL[suffix]
    exponent = suffix[1:]  # e/E and a signed number, as the pattern allows
    if not exponent.lstrip("+-").isdigit():
        raise QuantityError(f"{value!r}: a fractional exponent is not supported")
    if abs(int(exponent)) > MAX_EXPONENT:
        raise QuantityError(f"{value!r}: the exponent is beyond +-{MAX_EXPONENT}")
    return Fraction(10) ** int(exponent)
