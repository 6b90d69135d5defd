"""The test tiers: a marker per directory, and the unit tier's import blocker."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import TESTS, TIER_OF_DIR, tier_of
from tests.unit.conftest import HEAVY, PURE_ENV

REPO = TESTS.parent


def test_each_directory_has_its_tier() -> None:
    assert tier_of(TESTS / "unit" / "operator" / "test_spec.py") == "unit"
    assert tier_of(TESTS / "integration" / "test_operator.py") == "cluster"
    assert tier_of(TESTS / "chart" / "test_dockerfiles.py") == "cluster"
    assert tier_of(TESTS / "e2e" / "test_autoscaling.py") == "e2e"
    assert tier_of(TESTS / "node" / "test_helm_on_node.py") == "node"


@pytest.mark.parametrize("path", ["test_top.py", "scratch/test_x.py"])
def test_a_test_outside_the_tiers_is_refused(path: str) -> None:
    with pytest.raises(pytest.UsageError, match="tier directory"):
        tier_of(TESTS / path)


def test_the_tier_markers_are_the_registered_ones() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]
    registered = {m.partition(":")[0] for m in config["ini_options"]["markers"]}
    assert registered == set(TIER_OF_DIR.values())
    on_disk = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.glob("**/test_*.py"))}
    assert on_disk == set(TIER_OF_DIR)  # a new test directory needs a tier


def _import_in_pure_mode(module: str) -> subprocess.CompletedProcess[str]:
    code = f"import tests.unit.conftest\nimport {module}\n"
    env = {**os.environ, PURE_ENV: "1"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("module", [*HEAVY, "kubernetes.client"])
def test_pure_mode_refuses_the_heavy_packages(module: str) -> None:
    res = _import_in_pure_mode(module)
    assert res.returncode != 0
    assert "ModuleNotFoundError" in res.stderr and "the unit tier runs without" in res.stderr


def test_pure_mode_allows_the_rest() -> None:
    res = _import_in_pure_mode("genpool_core.scheduler")
    assert res.returncode == 0, res.stderr


def test_this_run_honours_pure_mode() -> None:
    if os.environ.get(PURE_ENV) == "1":
        assert not {m.partition(".")[0] for m in sys.modules} & set(HEAVY)
        with pytest.raises(ModuleNotFoundError, match="unit tier"):
            __import__("torch")
