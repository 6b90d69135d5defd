"""``python -m genpool_devcluster.interop capture|local|run|precise-prefix``: the
subcommands' flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from genpool_devcluster import interop
from genpool_devcluster.interop.common import LOG_DIR

COMMANDS = ("capture", "local", "run", "precise-prefix")


def _state_dir(text: str) -> Path:
    return Path(text).expanduser()


def _capture_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--worker-model", default="synthetic:tiny")
    s.add_argument("--no-worker", action="store_true", help="only the fakes (no genpool-worker)")
    s.add_argument("--out", type=Path, default=LOG_DIR / "capture.json")


def _local_flags(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", default="synthetic:tiny")
    s.add_argument("--max-tokens", type=int, default=8)
    s.add_argument("--no-epp", action="store_true",
                   help="no epp: the driver names the prefiller itself")  # fmt: skip
    s.add_argument("--host-override", action="store_true",
                   help="also send Host: <prefiller> (diagnostic)")  # fmt: skip


def _run_flags(s: argparse.ArgumentParser) -> None:
    from genpool_devcluster.cli import DEFAULT_STATE_DIR

    s.add_argument("--model", default="synthetic:pd",
                   help="the pools' model: synthetic:<name> or smollm2-135m")  # fmt: skip
    s.add_argument("--max-tokens", type=int, default=8)
    s.add_argument("--keep", action="store_true", help="leave the GenPools")
    s.add_argument("--host-override", action="store_true",
                   help="send Host: <prefill pod> (diagnostic, see local)")  # fmt: skip
    s.add_argument("--state-dir", type=_state_dir, default=_state_dir(DEFAULT_STATE_DIR),
                   help="the devcluster's state dir (default: %(default)s)")  # fmt: skip


def _precise_prefix_flags(s: argparse.ArgumentParser) -> None:
    from genpool_devcluster.cli import DEFAULT_STATE_DIR
    from genpool_devcluster.interop.precise_prefix import MODES, RESULTS

    s.add_argument("--model", default="synthetic:interop",
                   help="the GenPool's model: synthetic:<name> or smollm2-135m")  # fmt: skip
    s.add_argument("--block-size", type=int, default=16,
                   help="engine.kvBlockSize, the epp's blockSizeTokens")  # fmt: skip
    s.add_argument("--conversations", type=int, default=6)
    s.add_argument("--turns", type=int, default=4)
    s.add_argument("--max-tokens", type=int, default=24)
    s.add_argument("--runs", default=",".join(MODES),
                   help=f"comma-separated, of {', '.join(MODES)}")  # fmt: skip
    s.add_argument("--epp-source-commit", default=None,
                   help="the llm-d-router commit the epp was built from (recorded)")  # fmt: skip
    s.add_argument("--out", type=Path, default=RESULTS)
    s.add_argument("--keep", action="store_true", help="leave the GenPools")
    s.add_argument("--state-dir", type=_state_dir, default=_state_dir(DEFAULT_STATE_DIR),
                   help="the devcluster's state dir (default: %(default)s)")  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m genpool_devcluster.interop",
        description=(interop.__doc__ or "").split("\n\n")[0],
    )
    sub = p.add_subparsers(dest="command", required=True)
    flags = {"capture": _capture_flags, "local": _local_flags, "run": _run_flags,
             "precise-prefix": _precise_prefix_flags}  # fmt: skip
    for name in COMMANDS:
        s = sub.add_parser(name)
        s.add_argument("--bin", type=Path, required=True,
                       help="the directory holding pd-sidecar and epp")  # fmt: skip
        flags[name](s)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "capture":
        from genpool_devcluster.interop.capture import capture

        return capture(args)
    if args.command == "local":
        from genpool_devcluster.interop.local import local

        return local(args)
    if args.command == "precise-prefix":
        from genpool_devcluster.interop.precise_prefix import precise_prefix

        if args.conversations < 1 or args.turns < 2:
            raise SystemExit("at least one conversation of two turns")
        return precise_prefix(args)
    from genpool_devcluster.interop.cluster_run import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
