"""``genpool-operator`` argument validation (no kopf run)."""

from __future__ import annotations

import pytest

from genpool_operator.main import parse_args


def test_namespaces_and_defaults() -> None:
    args = parse_args(["--namespace", "a", "--namespace", "b-2"])
    assert args.namespace == ["a", "b-2"] and not args.all_namespaces
    assert args.liveness_port == 8080 and args.peering is None


def test_all_namespaces_excludes_namespace(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--all-namespaces"]).all_namespaces
    with pytest.raises(SystemExit) as info:
        parse_args(["--all-namespaces", "--namespace", "a"])
    assert info.value.code == 2


def test_own_namespace_from_the_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "genpool-system")
    assert parse_args([]).namespace == ["genpool-system"]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--namespace", "Bad_Name"],
        ["--namespace", "-x"],
        ["--namespace", "a" * 64],
        ["--all-namespaces", "--liveness-port", "70000"],
        ["--all-namespaces", "--liveness-port", "http"],
        ["--all-namespaces", "--peering", "Not Valid"],
        ["--all-namespaces", "--priority", "high"],
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err
