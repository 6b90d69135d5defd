"""The unit tier needs neither torch nor the Kubernetes stack.

With GENPOOL_UNIT_PURE=1 (`make unit`, and the unit half of `make test`) importing torch,
kubernetes or kopf fails here as it would where they are not installed, so a unit test that
pulls one in, directly or through a package it imports, fails instead of passing quietly.
Without it (a plain `pytest`, which may run every tier in one process) nothing is blocked:
the other tiers need those packages.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

import pytest

PURE_ENV = "GENPOOL_UNIT_PURE"
HEAVY = ("torch", "kubernetes", "kopf")


class HeavyImportBlocker(importlib.abc.MetaPathFinder):
    """Answers an import of a HEAVY package as 'not installed'."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in HEAVY:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: the unit tier runs without"
                f" {', '.join(HEAVY)} ({PURE_ENV}=1); a test that needs it belongs to another tier",
                name=fullname,
            )
        return None


def _install_blocker() -> None:
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in HEAVY)
    if loaded:  # imported before this conftest (a plugin, the root conftest): cannot unimport
        raise pytest.UsageError(f"{PURE_ENV}=1 but already imported: {', '.join(loaded)}")
    sys.meta_path.insert(0, HeavyImportBlocker())


if os.environ.get(PURE_ENV) == "1":
    _install_blocker()
