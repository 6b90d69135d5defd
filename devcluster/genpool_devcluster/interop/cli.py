"""``python -m genpool_devcluster.interop capture|local|run``: the subcommands' flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from genpool_devcluster import interop
from genpool_devcluster.interop.common import LOG_DIR


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m genpool_devcluster.interop",
        description=(interop.__doc__ or "").split("\n\n")[0],
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("capture", "local", "run"):
        s = sub.add_parser(name)
        s.add_argument("--bin", type=Path, required=True,
                       help="the directory holding pd-sidecar and epp")  # fmt: skip
        if name == "capture":
            s.add_argument("--worker-model", default="synthetic:tiny")
            s.add_argument("--no-worker", action="store_true",
                           help="only the fakes (no genpool-worker)")  # fmt: skip
            s.add_argument("--out", type=Path, default=LOG_DIR / "capture.json")
        elif name == "local":
            s.add_argument("--model", default="synthetic:tiny")
            s.add_argument("--max-tokens", type=int, default=8)
            s.add_argument("--no-epp", action="store_true",
                           help="no epp: the driver names the prefiller itself")  # fmt: skip
            s.add_argument("--host-override", action="store_true",
                           help="also send Host: <prefiller> (diagnostic)")  # fmt: skip
        else:
            s.add_argument("--model", default="synthetic:pd",
                           help="the pools' model: synthetic:<name> or smollm2-135m")  # fmt: skip
            s.add_argument("--max-tokens", type=int, default=8)
            s.add_argument("--keep", action="store_true", help="leave the GenPools")
            s.add_argument("--host-override", action="store_true",
                           help="send Host: <prefill pod> (diagnostic, see local)")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "capture":
        from genpool_devcluster.interop.capture import capture

        return capture(args)
    if args.command == "local":
        from genpool_devcluster.interop.local import local

        return local(args)
    from genpool_devcluster.interop.cluster_run import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
