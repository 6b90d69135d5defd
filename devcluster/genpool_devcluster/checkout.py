"""Which checkout a measured result comes from: its commit, and whether the code had
changes the commit does not hold (bench/freshness.py, docs/results.md "How the figures
stay true"). One rule for every result file: bench/provenance.py and the interop runs
use it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMIT_ENV = "GENPOOL_COMMIT"  # a copy of the tree without .git (the GPU machine) names it
# Results and prose are not what is measured: a run of several benches writes results,
# and the docs are written while they run.
NOT_MEASURED = (":(exclude)bench/results", ":(exclude)docs", ":(exclude)*.md")


def commit() -> str:
    """The checked-out commit (``$GENPOOL_COMMIT`` when set; empty outside a checkout)."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    found = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                           cwd=ROOT, check=False)  # fmt: skip
    return found.stdout.strip()


def is_dirty() -> bool:
    """Tracked code differs from the commit: the result is not the commit's alone (a
    tree named by ``$GENPOOL_COMMIT`` is taken as that commit's)."""
    if os.environ.get(COMMIT_ENV):
        return False
    found = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            *NOT_MEASURED], capture_output=True, text=True, cwd=ROOT,
                           check=False)  # fmt: skip
    return bool(found.stdout.strip())
