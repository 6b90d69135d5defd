"""What produced a result JSON: the checkout's commit and the command that ran
(docs/results.md says every figure points to a JSON that records both)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from genpool_devcluster.checkout import commit, is_dirty


def provenance(module: str, argv: Sequence[str] | None = None) -> dict[str, object]:
    """``{"commit", "command", "dirty"}`` for ``python -m <module> <argv>`` (argv: this
    process's); ``dirty``: tracked files had changes the commit does not hold."""
    args = sys.argv[1:] if argv is None else list(argv)
    return {"commit": commit(), "command": " ".join(["python -m", module, *args]),
            "dirty": is_dirty()}  # fmt: skip
