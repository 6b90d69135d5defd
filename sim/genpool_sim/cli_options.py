"""``genpool sim``'s command line: the option groups, their defaults and help, and the
argparse types that check each value (``genpool_sim.cli`` parses with it and runs).
A flag that sets a field of ``Workload``, ``GenCapacity``, ``GenPreemptionSettings``,
``KnobBounds``, ``TunerSettings``, ``TuneConfig`` or ``AutoscaleConfig`` takes its help
from the field's description (``genpool_core.field_help``)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from genpool_core.field_help import help_for
from genpool_core.knobs import DEFAULT_PAUSED_CAP_FRACTION, KnobBounds
from genpool_core.preemption import GenCapacity, GenPreemptionSettings
from genpool_core.tuner import TunerSettings
from genpool_sim.autoscale_cli import add_autoscale_options
from genpool_sim.cluster import MODES, ClusterConfig
from genpool_sim.datafiles import AZURE_CONV, data_file
from genpool_sim.experiment import Workload
from genpool_sim.phases import Phase, parse_phases
from genpool_sim.pool_control import TuneConfig
from genpool_sim.prefix_cli import add_conversation_load, add_prefix_options
from genpool_sim.slo_classes import SloClass, parse_classes

DEFAULT_TRACE = data_file(AZURE_CONV)


def _positive(kind: type[int] | type[float]):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        return value

    return parse


def _fraction(text: str) -> float:
    """A probability: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1]: {text!r}")
    return value


def _add_positive(
    group: argparse._ActionsContainer,
    flag: str,
    kind: type[int] | type[float],
    default: int | float,
    help_text: str,
) -> None:
    """A flag whose value must be a number > 0 of ``kind``."""
    group.add_argument(flag, type=_positive(kind), default=default, help=help_text)


def _list_of(kind: type[int] | type[float]):  # type: ignore[no-untyped-def]
    item = _positive(kind)
    return lambda text: [item(part) for part in text.split(",") if part]


def _modes(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"modes must be among {', '.join(MODES)}; got {text!r}")
    return modes


def _phases(text: str) -> list[Phase]:
    try:
        return parse_phases(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _classes(text: str) -> list[SloClass]:
    try:
        return parse_classes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def _target(text: str) -> float | None:
    return None if text == "auto" else float(_positive(float)(text))


def build_parser() -> argparse.ArgumentParser:
    """`genpool sim FLAGS` (the parser sits under `genpool`, which dispatches to it)."""
    parser = argparse.ArgumentParser(prog="genpool")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "sim",
        help="simulate a disaggregated GEN pool (docs/design.md#simulator)",
        description="Simulate a disaggregated GEN pool (docs/design.md#simulator).",
    )
    sim.add_argument(
        "--trace",
        type=Path,
        default=DEFAULT_TRACE,
        help="request trace: CSV (arrived_at,num_prefill_tokens,num_decode_tokens) or JSONL"
        " (default: the Azure conversation trace)",
    )
    _add_load_options(sim)
    _add_pool_options(sim)
    _add_output_options(sim)
    _add_tune_options(sim)
    add_prefix_options(sim)
    add_autoscale_options(sim)
    return parser


def _add_load_options(sim: argparse.ArgumentParser) -> None:
    load = sim.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency",
        type=_list_of(int),
        default=None,
        help=help_for(
            Workload, "concurrency", default=[220, 250], note="a comma-separated list runs each"
        ),
    )
    load.add_argument(
        "--rate", type=_positive(float), help="open loop: Gamma arrivals at this rate, requests/s"
    )
    load.add_argument(
        "--rate-phases",
        help=help_for(Workload, "rate_phases", note="as SECONDS:RATE,..."),
    )
    load.add_argument(
        "--replay", action="store_true", help="open loop: the trace's own arrival times"
    )
    load.add_argument(
        "--phases",
        type=_phases,
        help=help_for(Workload, "phases", note="as SECONDS:CLIENTS,..."),
    )
    add_conversation_load(load)
    _add_positive(sim, "--cv", float, 1.0, help_for(Workload, "cv", default=1.0))
    _add_positive(
        sim,
        "--time-scale",
        float,
        1.0,
        "factor on replayed arrival times, unitless (below 1: more load; default: 1)",
    )
    sim.add_argument(
        "--classes",
        type=_classes,
        help=help_for(
            Workload,
            "classes",
            note="as NAME:SHARE[:tpot_ms=MS][:ttft_ms=MS],... (shares add up to 1;"
            " T_i = 1000/tpot_ms, D_i = ttft_ms/1000); adds the per_request_tps run and"
            " per-class attainment (docs/sim.md)",
        ),
    )
    sim.add_argument(
        "--duration",
        type=_positive(float),
        help=help_for(Workload, "duration_s", default=600.0),
    )
    sim.add_argument(
        "--warmup",
        type=float,
        default=60.0,
        help=help_for(Workload, "warmup_s", default=60.0),
    )


def _add_pool_options(sim: argparse.ArgumentParser) -> None:
    _add_positive(sim, "--workers", int, 8, help_for(ClusterConfig, "workers"))
    _add_positive(
        sim,
        "--max-batch",
        int,
        16,
        help_for(GenCapacity, "max_batch_size", default=16, note="A = B here"),
    )
    _add_positive(sim, "--ctx-servers", int, 4, help_for(ClusterConfig, "ctx_servers"))
    _add_positive(sim, "--kv-transfer-s-per-token", float, 0.0,
                  help_for(ClusterConfig, "kv_transfer_s_per_token"))  # fmt: skip
    sim.add_argument(
        "--modes",
        type=_modes,
        default=list(MODES),
        help=f"preemption modes to compare, comma-separated (default: {','.join(MODES)})",
    )
    sim.add_argument(
        "--target-output-tps",
        type=_target,
        default=None,
        help=help_for(
            GenPreemptionSettings,
            "target_output_tps",
            default="auto",
            note="or auto: the off run's median per-request output rate / 1.10, same seed",
        ),
    )
    sim.add_argument(
        "--paused-cap-fraction",
        type=_list_of(float),
        default=None,
        help=help_for(
            ClusterConfig,
            "paused_cap_fraction",
            default=DEFAULT_PAUSED_CAP_FRACTION,
            note="a comma-separated list gives the curve; not with --autoscale, whose pools"
            " start as a GenPool does",
        ),
    )
    _add_positive(
        sim,
        "--tpot-budget",
        float,
        0.1,
        help_for(GenPreemptionSettings, "tpot_budget", default=0.1),
    )
    sim.add_argument(
        "--kv-blocks",
        type=_positive(int),
        default=None,
        help=help_for(
            ClusterConfig, "kv_blocks", note="adds the kv_* metrics to the table and JSON"
        ),
    )
    sim.add_argument(
        "--kv-block-size",
        type=_positive(int),
        default=None,
        help=help_for(ClusterConfig, "kv_block_size", note="with --kv-blocks"),
    )
    sim.add_argument(
        "--speculative-tokens",
        type=_positive(int),
        default=None,
        help=help_for(ClusterConfig, "num_speculative_tokens", note="with --acceptance-rate"),
    )
    sim.add_argument(
        "--acceptance-rate",
        type=_fraction,
        default=None,
        help=help_for(ClusterConfig, "acceptance_rate", note="with --speculative-tokens"),
    )


def _add_output_options(sim: argparse.ArgumentParser) -> None:
    _add_positive(sim, "--seeds", int, 4, "runs per setting, seeds 0..N-1 (default: 4)")
    _add_positive(sim, "--jobs", int, 2, "simulations in parallel processes (default: 2)")
    sim.add_argument("--json", type=Path, help="write all results as JSON to this file")
    sim.add_argument("--plot", type=Path, help="write PNG plots into this folder")
    sim.add_argument(
        "--stat-lines", action="store_true", help="print seed 0's stat lines (16 per run)"
    )


def _add_tune_options(sim: argparse.ArgumentParser) -> None:
    tune = sim.add_argument_group("tuner in the loop (target_output_tps runs)")
    tune.add_argument("--tune", action="store_true", help="run the tuner (docs/design.md#tuner)")
    _add_positive(
        tune,
        "--tune-interval",
        float,
        30.0,
        help_for(TuneConfig, "interval_s", note="with --autoscale: --scale-interval"),
    )
    tune.add_argument(
        "--headroom-min",
        type=_count,
        default=0,
        help=help_for(KnobBounds, "min_resident_headroom", default=0),
    )
    tune.add_argument(
        "--headroom-max",
        type=_count,
        help=help_for(KnobBounds, "max_resident_headroom", default="A"),
    )
    tune.add_argument(
        "--cap-min", type=_count, default=0, help=help_for(KnobBounds, "min_paused_cap", default=0)
    )
    tune.add_argument(
        "--cap-max", type=_count, help=help_for(KnobBounds, "max_paused_cap", default="A")
    )
    tune.add_argument(
        "--tune-cooldown",
        type=_count,
        default=2,
        help=help_for(TunerSettings, "cooldown_intervals"),
    )
    tune.add_argument(
        "--tune-rule",
        choices=("guarded", "literal"),
        default="guarded",
        help=help_for(
            TunerSettings, "guarded", default="guarded", note="guarded: on, literal: off"
        ),
    )
