"""``y = x @ W.T (+ residual)``, through oneDNN with a pre-packed weight on the CPU.

At decode batch sizes (M = 1..16 rows) MKL's sgemm reached only ~26 GFLOPS on the
2-core AMD EPYC we measure on (the LM head and gate/up projections dominate a
step) and did not scale to a second thread. oneDNN with the weight reordered once
into its blocked layout (the kernels inductor uses for frozen CPU linears) measured
1.2-1.7x faster at M = 8..16 on one thread and ~2.6x on the LM head with two.

The oneDNN entry points are private torch ops, so packing is attempted per weight,
checked against ``F.linear`` once, and silently replaced by ``F.linear`` when the
ops are missing or disagree: correctness never depends on them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


def onednn_available(device: torch.device, dtype: torch.dtype) -> bool:
    ops: Any = torch.ops.mkldnn
    mkldnn: Any = torch.backends.mkldnn
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and bool(mkldnn.is_available())
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


class Linear:
    """A linear layer over an ``[out, in]`` weight and an optional ``[out]`` bias."""

    def __init__(
        self, weight: torch.Tensor, *, pack: bool, bias: torch.Tensor | None = None
    ) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self._packed: torch.Tensor | None = _pack(weight, bias) if pack else None
        # Keep only one copy of the weight: the packed one replaces the plain one.
        self._weight: torch.Tensor | None = None if self._packed is not None else weight

    @property
    def packed(self) -> bool:
        return self._packed is not None

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T``, plus ``residual`` when given (fused into the GEMM where possible)."""
        if self._packed is not None:
            ops: Any = torch.ops.mkldnn
            if residual is None:
                out: torch.Tensor = ops._linear_pointwise(
                    x, self._packed, self.bias, "none", [], ""
                )
            else:
                out = ops._linear_pointwise.binary(x, residual, self._packed, self.bias, "add")
            return out
        assert self._weight is not None
        if residual is None:
            return F.linear(x, self._weight, self.bias)
        if self.bias is not None:
            residual = residual + self.bias
        return torch.addmm(residual, x, self._weight.t())


def _pack(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    ops: Any = torch.ops.mkldnn
    try:
        with torch.inference_mode():
            packed: torch.Tensor = ops._reorder_linear_weight(weight)
            probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
            base = torch.randn(3, weight.shape[0], generator=torch.Generator().manual_seed(1))
            want = F.linear(probe, weight, bias)
            got = ops._linear_pointwise(probe, packed, bias, "none", [], "")
            got_res = ops._linear_pointwise.binary(probe, base, packed, bias, "add")
    except (RuntimeError, NotImplementedError):
        log.debug("oneDNN weight packing unavailable; using F.linear", exc_info=True)
        return None
    # Summation order differs; anything beyond ~1e-6 relative would be a real bug.
    tol = 1e-4 * want.abs().max().item() + 1e-6
    if not (torch.allclose(got, want, atol=tol) and torch.allclose(got_res, want + base, atol=tol)):
        log.warning("oneDNN packed linear disagrees with F.linear; using F.linear")
        return None
    return packed
