"""Step-time model of the simulator (docs/design.md#step-time-model) and its least-squares fit.

Decode step: ``t = t0 + c * active + k * sum(context tokens of the active requests)``.
Prefill of one prompt (context stage): ``p0 + p1 * prompt_tokens``.

Both are fitted to Splitwise's measured vLLM step times
(``shared/data/splitwise_perf_model.csv``; H100-80GB, llama2-70b, TP8 by
default); docs/step-model.md records the fit. The CSV rows come in as dicts
(e.g. from ``csv.DictReader``), so this module does no I/O; ``DEFAULT_STEP_MODEL``
hard-codes the fitted values and a test re-fits them from the file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

_MS = 1e-3  # the CSV is in milliseconds, the simulator in seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class StepModel:
    """Linear step times in seconds.

    Fits for other configurations of the CSV can give negative coefficients
    (e.g. llama2-70b H100 TP2 has k < 0, bloom-176b a negative prefill
    intercept); only finiteness is checked here, a simulator should use a model
    whose times stay positive over its range.
    """

    t0_s: float
    per_request_s: float
    per_context_token_s: float
    prefill_base_s: float
    prefill_per_token_s: float

    def __post_init__(self) -> None:
        for name in (f.name for f in fields(self)):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"StepModel.{name} must be finite, got {value!r}")

    def decode_step_time(self, num_active: int, context_tokens: int) -> float:
        """One decode step of ``num_active`` requests holding ``context_tokens`` in all.

        ``context_tokens`` is the sum over the active requests (prompt plus tokens
        generated so far); paused residents are not in the batch and not in the sum.
        """
        if num_active < 0 or context_tokens < 0:
            raise ValueError(f"negative batch ({num_active}) or context ({context_tokens})")
        return (
            self.t0_s + self.per_request_s * num_active + self.per_context_token_s * context_tokens
        )

    def prefill_time(self, prompt_tokens: int) -> float:
        """Prefill of one prompt of ``prompt_tokens`` tokens (batch of one)."""
        if prompt_tokens < 0:
            raise ValueError(f"negative prompt length {prompt_tokens}")
        return self.prefill_base_s + self.prefill_per_token_s * prompt_tokens


@dataclass(frozen=True, slots=True)
class FitStats:
    """Quality of one least-squares fit against the rows it was fitted on."""

    n_rows: int
    r_squared: float
    mean_rel_error: float
    max_rel_error: float


@dataclass(frozen=True, slots=True)
class FitResult:
    """The fitted model and how well each of its two parts fits."""

    model: StepModel
    decode: FitStats
    prefill: FitStats

    # The decode fit is the one the simulator's results hinge on; expose it flat.
    @property
    def n_rows(self) -> int:
        return self.decode.n_rows

    @property
    def r_squared(self) -> float:
        return self.decode.r_squared

    @property
    def mean_rel_error(self) -> float:
        return self.decode.mean_rel_error

    @property
    def max_rel_error(self) -> float:
        return self.decode.max_rel_error


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting on a small dense system."""
    n = len(rhs)
    a = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            raise ValueError("singular normal equations: the regressors are collinear")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for j in range(col, n + 1):
                a[r][j] -= f * a[col][j]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][j] * x[j] for j in range(r + 1, n))) / a[r][r]
    return x


def ols(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> tuple[list[float], FitStats]:
    """Ordinary least squares of ``ys`` on the columns of ``xs`` (include a 1 column).

    Columns are scaled to unit maximum before forming ``X^T X``: the regressors
    span 1 to ~1e5 here, and unscaled normal equations would lose digits.
    """
    if not xs or len(xs) != len(ys):
        raise ValueError(f"need matching non-empty rows, got {len(xs)} and {len(ys)}")
    p = len(xs[0])
    scale = [max(abs(row[j]) for row in xs) or 1.0 for j in range(p)]
    z = [[row[j] / scale[j] for j in range(p)] for row in xs]
    xtx = [[sum(row[i] * row[j] for row in z) for j in range(p)] for i in range(p)]
    xty = [sum(row[i] * y for row, y in zip(z, ys, strict=True)) for i in range(p)]
    beta = [b / s for b, s in zip(_solve(xtx, xty), scale, strict=True)]
    pred = [sum(b * v for b, v in zip(beta, row, strict=True)) for row in xs]
    mean_y = sum(ys) / len(ys)
    ss_res = sum((y - f) ** 2 for y, f in zip(ys, pred, strict=True))
    ss_tot = sum((y - mean_y) ** 2 for y in ys)
    rel = [abs(f - y) / abs(y) for y, f in zip(ys, pred, strict=True)]
    stats = FitStats(
        n_rows=len(ys),
        r_squared=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        mean_rel_error=sum(rel) / len(rel),
        max_rel_error=max(rel),
    )
    return beta, stats


def mean_decode_context(prompt_size: float, token_size: float) -> float:
    """Context length per request averaged over a decode of ``token_size`` tokens.

    ``token_time`` in the CSV is the mean step time over the whole decode
    (``e2e_time ~= prompt_time + (token_size - 1) * token_time``), during which a
    request's context grows from ``prompt_size`` to ``prompt_size + token_size``;
    its mean, ``prompt_size + token_size / 2``, is the context a mean step sees.
    Some runs stopped before ``token_size`` tokens (their ``e2e_time`` shows it);
    using their measured length moves the fit by under 4 % (docs/step-model.md),
    so the nominal length is kept: it needs no inferred quantity.
    """
    return prompt_size + token_size / 2.0


def fit_step_model(
    rows: Iterable[dict[str, str]],
    model: str = "llama2-70b",
    hardware: str = "h100-80gb",
    tensor_parallel: int = 8,
) -> FitResult:
    """Fit both parts of the step model to the matching rows of the Splitwise CSV.

    Decode: ``token_time`` (ms) on ``batch_size`` and ``batch_size *
    mean_decode_context(...)``, every matching row. Prefill: ``prompt_time`` (ms)
    on ``prompt_size``, the ``batch_size == 1`` rows (prefill of one prompt).
    """
    decode_x: list[list[float]] = []
    decode_y: list[float] = []
    prefill_x: list[list[float]] = []
    prefill_y: list[float] = []
    seen: set[tuple[str, str, str]] = set()
    for row in rows:
        key = (row["model"], row["hardware"], row["tensor_parallel"])
        seen.add(key)
        if key != (model, hardware, str(tensor_parallel)):
            continue
        batch = float(row["batch_size"])
        prompt = float(row["prompt_size"])
        context = mean_decode_context(prompt, float(row["token_size"]))
        decode_x.append([1.0, batch, batch * context])
        decode_y.append(float(row["token_time"]) * _MS)
        if batch == 1:
            prefill_x.append([1.0, prompt])
            prefill_y.append(float(row["prompt_time"]) * _MS)
    if not decode_y:
        known = ", ".join("/".join(k) for k in sorted(seen))
        raise ValueError(f"no rows for {model}/{hardware}/{tensor_parallel}; have: {known}")
    if not prefill_y:
        raise ValueError(f"no batch_size 1 rows for {model}/{hardware}/{tensor_parallel}")
    (t0, per_request, per_token), decode = ols(decode_x, decode_y)
    (p0, p1), prefill = ols(prefill_x, prefill_y)
    step = StepModel(
        t0_s=t0,
        per_request_s=per_request,
        per_context_token_s=per_token,
        prefill_base_s=p0,
        prefill_per_token_s=p1,
    )
    return FitResult(step, decode, prefill)


# fit_step_model(splitwise_perf_model.csv) for llama2-70b / h100-80gb / TP8, to four
# significant digits (tests/unit/core/test_stepmodel.py re-fits and compares).
DEFAULT_STEP_MODEL = StepModel(
    t0_s=29.83e-3,  # 29.83 ms
    per_request_s=0.2077e-3,  # 0.2077 ms per active request
    per_context_token_s=0.1731e-6,  # 0.1731 us per context token (35 ms per 200k tokens)
    prefill_base_s=1.762e-3,  # 1.762 ms
    prefill_per_token_s=0.09939e-3,  # 0.09939 ms per prompt token
)
