"""Run the benchmarks and write ``bench/results/<name>.json`` for each.

    python -m bench.run              # every benchmark listed in BENCHMARKS
    python -m bench.run scheduler    # a subset, by name
    python -m bench.run --quick      # fewer passes: a smoke run, numbers not meaningful

Each benchmark module exposes ``run(*, quick: bool) -> dict`` (JSON-serialisable) and
``format_table(result: dict) -> str`` (a short human-readable summary).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.provenance import provenance

# name -> module; the name is also the results file name.
BENCHMARKS: dict[str, str] = {
    "scheduler": "bench.scheduler",
    "sim": "bench.sim",
    "worker": "bench.worker",
    "operator": "bench.operator",
    "kv_residents": "bench.kv_residents",
    "fuzz": "bench.fuzz",
    "faults": "bench.faults",
    "guidellm": "bench.guidellm_bench",
    "guidellm_pool": "bench.guidellm_pool",  # on the devcluster's node (genpool devcluster up)
    "decode_check": "bench.decode_check",
    "detokenize": "bench.detokenize",
    "penalties": "bench.penalties",
    "batched_prefill": "bench.batched_prefill",
}

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Run GenPool benchmarks; each writes bench/results/<name>.json.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default: all). Available: {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short smoke run (few passes); the numbers are not meaningful",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=RESULTS_DIR,
        help=f"where the JSON files go (default: {RESULTS_DIR})",
    )
    return parser


def select(names: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """The benchmarks to run, in the order given, duplicates dropped; errors name the bad ones."""
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(
            f"unknown benchmark{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} "
            f"(available: {', '.join(BENCHMARKS)})"
        )
    return list(dict.fromkeys(names)) or list(BENCHMARKS)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    names = select(args.names, parser)
    results_dir: Path = args.results_dir
    results_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        module: Any = importlib.import_module(BENCHMARKS[name])
        print(f"== {name} ==", flush=True)
        argv_of = [name, *(["--quick"] if args.quick else [])]
        source = provenance("bench.run", argv_of)  # the tree that runs, not the one at the end
        result = {**source, **module.run(quick=args.quick)}
        path = results_dir / f"{name}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(module.format_table(result))
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
