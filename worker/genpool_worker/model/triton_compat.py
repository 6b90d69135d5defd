"""Triton, when installed: ``triton`` and ``tl`` are None without it.

Triton ships with CUDA builds of torch; without it the model's torch paths are used
(``paged_attention.is_usable`` is False and the fused ops are never called).
"""

from __future__ import annotations

__all__ = ["tl", "triton"]

try:
    import triton  # type: ignore[import-untyped]
    import triton.language as tl  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - depends on the install
    triton = None
    tl = None
