"""What produced a result JSON: the checkout's commit and the command that ran
(docs/results.md says every figure points to a JSON that records both)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


COMMIT_ENV = "GENPOOL_COMMIT"  # a copy of the tree without .git (the GPU machine) names it


def commit() -> str:
    """The checked-out commit (``$GENPOOL_COMMIT`` when set; empty outside a checkout)."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                           cwd=ROOT, check=False)  # fmt: skip
    return found.stdout.strip()


def is_dirty() -> bool:
    """Tracked files differ from the commit: the result is not the commit's alone (a
    tree named by ``$GENPOOL_COMMIT`` is taken as that commit's)."""
    if os.environ.get(COMMIT_ENV):
        return False
    # Results and prose are not what is measured (a run of several benches writes results;
    # the docs are written while they run).
    found = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(exclude)bench/results", ":(exclude)docs", ":(exclude)*.md"],
                           capture_output=True, text=True, cwd=ROOT, check=False)  # fmt: skip
    return bool(found.stdout.strip())


def provenance(module: str, argv: Sequence[str] | None = None) -> dict[str, object]:
    """``{"commit", "command", "dirty"}`` for ``python -m <module> <argv>`` (argv: this
    process's); ``dirty``: tracked files had changes the commit does not hold."""
    args = sys.argv[1:] if argv is None else list(argv)
    return {"commit": commit(), "command": " ".join(["python -m", module, *args]),
            "dirty": is_dirty()}  # fmt: skip
