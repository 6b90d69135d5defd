"""``genpool sim|worker|operator|devcluster``: one command line, each subcommand imported
only when it runs.

``genpool --help`` imports no torch and no Kubernetes client: the subcommand's package (and
with it torch for the worker, kopf for the operator) loads only after the subcommand is
chosen, and the rest of the command line goes to that package's own ``main(argv)``, which
owns its flags and their help. The images keep their own console scripts
(``genpool-worker``, ``genpool-worker-drain``, ``genpool-operator``): an image installs only
its packages, so its entrypoint must not depend on this one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PROG = "genpool"


@dataclass(frozen=True)
class Subcommand:
    module: str  # defines main(argv: Sequence[str] | None) -> int
    package: str  # the import that fails when the package's extra is not installed
    extra: str  # pip extra that installs it
    summary: str
    argv_prefix: tuple[str, ...] = ()  # what the module's own parser expects before the flags


SUBCOMMANDS: dict[str, Subcommand] = {
    "sim": Subcommand(
        "genpool_sim.cli",
        "genpool_sim",
        "sim",
        "simulate a disaggregated decode pool from a trace (no torch, no cluster)",
        argv_prefix=("sim",),  # genpool_sim.cli parses `sim FLAGS`
    ),
    "worker": Subcommand(
        "genpool_worker.worker_cli",
        "genpool_worker",
        "worker",
        "run one decode worker: model, engine and HTTP API (loads torch)",
    ),
    "operator": Subcommand(
        "genpool_operator.main",
        "genpool_operator",
        "operator",
        "run the kopf operator that reconciles GenPool resources",
    ),
    "devcluster": Subcommand(
        "genpool_devcluster.cli",
        "genpool_devcluster",
        "dev",
        "local control plane for tests and the demo: build|up|down|status|env",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: lists the subcommands; their flags belong to their own parsers."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="GenPool: decode-worker pools for disaggregated LLM serving.",
        epilog=f"`{PROG} COMMAND --help` shows a command's flags.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in SUBCOMMANDS.items():
        sub.add_parser(name, help=command.summary, add_help=False)
    return parser


def _entry(command: Subcommand) -> Callable[[Sequence[str]], int]:
    try:
        module = importlib.import_module(command.module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != command.package:
            raise  # a dependency of an installed package is missing: show the real error
        raise SystemExit(
            f"{PROG}: error: {command.package} is not installed here"
            f" (pip install 'genpool[{command.extra}]')"
        ) from None
    entry: Callable[[Sequence[str]], int] = module.main
    return entry


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args or args[0] not in SUBCOMMANDS:
        parser.parse_args(args)  # prints the help (-h) or the usage error, and exits
        parser.error(f"unexpected arguments: {' '.join(args)}")  # pragma: no cover
    command = SUBCOMMANDS[args[0]]
    return _entry(command)([*command.argv_prefix, *args[1:]])


if __name__ == "__main__":
    sys.exit(main())
