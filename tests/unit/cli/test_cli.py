"""``genpool``: one command line over the packages, each imported only when its subcommand runs."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from genpool_cli.main import SUBCOMMANDS, main

HEAVY = ("torch", "kubernetes", "kopf")


def imported_after(argv: list[str]) -> tuple[int, str, set[str]]:
    """(exit status, stdout, top-level modules loaded) of `genpool ARGV` in a fresh interpreter."""
    code = (
        "import json, sys\n"
        "from genpool_cli.main import main\n"
        "try:\n"
        f"    status = main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    status = exc.code\n"
        "print(json.dumps([status, sorted({m.split('.')[0] for m in sys.modules})]))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    *help_lines, last = res.stdout.rstrip("\n").split("\n")
    status, modules = json.loads(last)
    return status, "\n".join(help_lines), set(modules)


def test_help_lists_every_subcommand_and_imports_no_package() -> None:
    status, out, modules = imported_after(["--help"])
    assert status == 0
    for name, command in SUBCOMMANDS.items():
        assert name in out and command.summary.split()[0] in out
    assert not modules & {*HEAVY, "genpool_sim", "genpool_worker", "genpool_operator"}
    assert "genpool_devcluster" not in modules


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_each_subcommand_help_loads_only_its_package(name: str) -> None:
    status, out, modules = imported_after([name, "--help"])
    assert status == 0 and out.startswith("usage: genpool")
    assert not modules & set(HEAVY)  # every --help answers without torch or Kubernetes
    ours = {m for m in modules if m.startswith("genpool_")}
    assert ours <= {"genpool_cli", "genpool_core", SUBCOMMANDS[name].package}


def test_sim_help_has_units() -> None:
    status, out, _ = imported_after(["sim", "--help"])
    assert status == 0 and out.startswith("usage: genpool sim")
    text = " ".join(out.split())
    assert "--tpot-budget" in text and "relative TPOT inflation" in text
    assert "output tokens/s per request" in text  # --target-output-tps


def test_devcluster_help_is_its_own_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["devcluster", "up", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: genpool devcluster up")
    assert "seconds to become ready" in out


@pytest.mark.parametrize("argv", [[], ["bogus"], ["--bogus"], ["Sim"]])
def test_missing_or_unknown_subcommand_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: genpool")
    assert "COMMAND" in err


def test_arguments_reach_the_subcommand_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    # The simulator's own validation answers: the flag went through, `sim` prefixed.
    with pytest.raises(SystemExit) as info:
        main(["sim", "--modes", "bogus"])
    assert info.value.code == 2
    assert "modes must be among" in capsys.readouterr().err


def test_a_package_that_is_not_installed_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "genpool_devcluster.cli", None)  # import raises
    monkeypatch.setitem(sys.modules, "genpool_devcluster", None)
    with pytest.raises(SystemExit) as info:
        main(["devcluster", "status"])
    assert "genpool_devcluster is not installed" in str(info.value.code)


def test_the_console_script_is_this_cli() -> None:
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["genpool"] == "genpool_cli.main:main"


def _flags(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, str | None]]:
    """(prog and option, help) of every option, through the subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, f"{prog} {name}")
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            yield f"{prog} {action.option_strings[-1]}", action.help


def test_every_flag_has_help_text() -> None:
    from genpool_devcluster.cli import _parser as devcluster_parser
    from genpool_operator.main import build_parser as operator_parser
    from genpool_sim.cli import build_parser as sim_parser

    flags = [
        *_flags(sim_parser(), "genpool"),
        *_flags(operator_parser(), "genpool-operator"),
        *_flags(devcluster_parser(), "genpool devcluster"),
    ]
    assert len(flags) > 40
    assert [flag for flag, text in flags if not text] == []
