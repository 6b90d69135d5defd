"""What a pod inherits of the pod runner's environment (genpool_devcluster.podrunner.podenv)."""

from __future__ import annotations

import pytest

from genpool_devcluster.podrunner.podenv import base_env


def test_pods_import_what_the_pod_runner_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """PYTHONPATH passes through: a worktree's pods run the worktree's packages."""
    monkeypatch.setenv("PYTHONPATH", "/tree/core:/tree/worker")
    monkeypatch.setenv("SOME_SECRET", "x")
    env = base_env([])
    assert env["PYTHONPATH"] == "/tree/core:/tree/worker"
    assert "SOME_SECRET" not in env
    monkeypatch.delenv("PYTHONPATH")
    assert "PYTHONPATH" not in base_env([])
