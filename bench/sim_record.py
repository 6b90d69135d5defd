"""A ``genpool sim`` run whose ``--json`` records what produced it (docs/results.md, "How
the figures stay true"): the checkout's commit, this command and whether the tree was
clean, taken before the simulator starts.

    python -m bench.sim_record sim --concurrency 220 --seeds 8 ... --json OUT.json

The arguments are ``genpool sim``'s own (``genpool_sim.cli``), ``--json`` required.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.provenance import provenance
from genpool_sim import cli


def _json_path(argv: Sequence[str]) -> Path | None:
    for i, arg in enumerate(argv):
        if arg == "--json" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--json="):
            return Path(arg.removeprefix("--json="))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = _json_path(args)
    if not args or args[0] != "sim" or out is None:
        print("usage: python -m bench.sim_record sim [genpool sim flags] --json OUT.json",
              file=sys.stderr)  # fmt: skip
        return 2
    source = provenance("bench.sim_record", args)
    status = cli.main(args)
    if status != 0:
        return status
    document = json.loads(out.read_text())
    out.write_text(json.dumps({**source, **document}, indent=1, allow_nan=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
