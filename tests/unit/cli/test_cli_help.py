"""A CLI flag that sets a settings field takes its help from that field's one description
(``genpool_core.field_help``), so the help and the model cannot drift apart. The worker's
parser is built from its torch-free config module, as ``genpool-worker --help`` does."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel, Field

from genpool_core.field_help import DESCRIPTION, describe, format_default, help_for
from genpool_core.knobs import KnobBounds
from genpool_core.preemption import GenCapacity, GenPreemptionSettings
from genpool_core.scaler import ScalerSettings
from genpool_core.tuner import TunerSettings
from genpool_sim.autoscale import AutoscaleConfig
from genpool_sim.autoscale_cli import autoscale_config
from genpool_sim.cli import tune_config
from genpool_sim.cli_options import build_parser as sim_parser
from genpool_sim.cluster import ClusterConfig
from genpool_sim.conversations import ConversationSettings
from genpool_sim.experiment import Workload
from genpool_sim.pool_control import TuneConfig
from genpool_worker.worker_args import build_parser as worker_parser
from genpool_worker.worker_config import WorkerConfig

# `genpool sim` flags and the field each one sets.
SIM_FLAGS: dict[str, tuple[type, str]] = {
    "--workers": (ClusterConfig, "workers"),
    "--ctx-servers": (ClusterConfig, "ctx_servers"),
    "--kv-transfer-s-per-token": (ClusterConfig, "kv_transfer_s_per_token"),
    "--paused-cap-fraction": (ClusterConfig, "paused_cap_fraction"),
    "--kv-blocks": (ClusterConfig, "kv_blocks"),
    "--kv-block-size": (ClusterConfig, "kv_block_size"),
    "--speculative-tokens": (ClusterConfig, "num_speculative_tokens"),
    "--acceptance-rate": (ClusterConfig, "acceptance_rate"),
    "--concurrency": (Workload, "concurrency"),
    "--rate-phases": (Workload, "rate_phases"),
    "--phases": (Workload, "phases"),
    "--cv": (Workload, "cv"),
    "--classes": (Workload, "classes"),
    "--duration": (Workload, "duration_s"),
    "--warmup": (Workload, "warmup_s"),
    "--max-batch": (GenCapacity, "max_batch_size"),
    "--target-output-tps": (GenPreemptionSettings, "target_output_tps"),
    "--tpot-budget": (GenPreemptionSettings, "tpot_budget"),
    # the tuner in the loop
    "--tune-interval": (TuneConfig, "interval_s"),
    "--headroom-min": (KnobBounds, "min_resident_headroom"),
    "--headroom-max": (KnobBounds, "max_resident_headroom"),
    "--cap-min": (KnobBounds, "min_paused_cap"),
    "--cap-max": (KnobBounds, "max_paused_cap"),
    "--tune-cooldown": (TunerSettings, "cooldown_intervals"),
    "--tune-rule": (TunerSettings, "guarded"),
    # --autoscale
    "--slo-ttft-p90": (AutoscaleConfig, "slo_ttft_p90_s"),
    "--slo-attainment": (AutoscaleConfig, "attainment"),
    "--min-replicas": (AutoscaleConfig, "min_replicas"),
    "--max-replicas": (AutoscaleConfig, "max_replicas"),
    "--startup-delay": (AutoscaleConfig, "startup_delay_s"),
    "--scale-interval": (AutoscaleConfig, "interval_s"),
    "--capacity-override": (AutoscaleConfig, "capacity_override"),
    "--schedule": (AutoscaleConfig, "schedule"),
    "--learn-days": (AutoscaleConfig, "learn_days"),
    # conversations and prefix caching
    "--conversations": (ConversationSettings, "rate"),
    "--system-prompt-tokens": (ConversationSettings, "system_prompt_tokens"),
    "--system-prompts": (ConversationSettings, "system_prompts"),
    "--conv-turns": (ConversationSettings, "turns"),
    "--conv-think-s": (ConversationSettings, "think_s"),
    "--conv-message-scale": (ConversationSettings, "message_scale"),
    "--conv-max-context": (ConversationSettings, "max_context_tokens"),
    "--colocated": (ClusterConfig, "colocated"),
    "--prefix-caching": (ClusterConfig, "prefix_caching"),
    "--router": (ClusterConfig, "router"),
}
# `genpool sim` flags whose help stays hand-written: they set no described field (a mode,
# a file, a run count, a switch); --workers, --ctx-servers and --paused-cap-fraction set
# ClusterConfig fields, which have no descriptions yet.
SIM_HAND_WRITTEN = frozenset({
    "-h", "--help", "--trace", "--rate", "--replay", "--time-scale", "--modes", "--seeds",
    "--jobs", "--json",
    "--plot", "--stat-lines", "--tune", "--autoscale", "--policies",
})  # fmt: skip
# Flags whose unset value (None) means a default computed elsewhere, shown as such.
SIM_SHOWN_DEFAULTS = {"--headroom-max": "A", "--cap-max": "A", "--target-output-tps": "auto",
                      "--kv-block-size": "16"}  # fmt: skip
# The dataclasses behind the tuner and the scaler: every field carries its description.
DESCRIBED = (KnobBounds, TunerSettings, ScalerSettings, TuneConfig, AutoscaleConfig,
             ConversationSettings)  # fmt: skip
# AutoscaleConfig fields handed to ScalerSettings unchanged in meaning: one description.
SCALER_FIELDS = {"slo_ttft_p90_s": "ttft_p90_s", "max_replicas": "max_replicas"}
CORE_FIELDS: dict[str, type] = {
    **{f.name: GenCapacity for f in dataclasses.fields(GenCapacity)},
    **dict.fromkeys(GenPreemptionSettings.model_fields, GenPreemptionSettings),
}


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option by each of its flags, through the subcommands."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= options(sub)
        else:
            found |= dict.fromkeys(action.option_strings, action)
    return found


def shown(action: argparse.Action) -> str:
    """The help as ``--help`` prints it, before line wrapping (argparse unescapes %%)."""
    assert action.help is not None
    return action.help.replace("%%", "%")


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("name", sorted(WorkerConfig.model_fields))
def test_every_worker_flag_help_is_its_field_description(name: str) -> None:
    text = shown(options(worker_parser())[flag_of(name)])
    assert text.startswith(describe(WorkerConfig, name))
    default = WorkerConfig.model_fields[name].default
    if default is not None:
        assert text.endswith(f" (default: {format_default(default)})")
    else:  # unset is described in the description, not shown as a default
        assert "(default:" not in text


def test_worker_fields_of_the_core_models_have_their_description() -> None:
    shared = [name for name in WorkerConfig.model_fields if name in CORE_FIELDS]
    assert {"tpot_budget", "target_output_tps", "paused_cap", "max_batch_size"} <= set(shared)
    for name in shared:
        assert describe(WorkerConfig, name) == describe(CORE_FIELDS[name], name), name


@pytest.mark.parametrize("flag", sorted(SIM_FLAGS))
def test_sim_flag_help_is_its_field_description(flag: str) -> None:
    model, name = SIM_FLAGS[flag]
    action = options(sim_parser())[flag]
    assert action.dest == flag.removeprefix("--").replace("-", "_")
    text = shown(action)
    assert text.startswith(describe(model, name)), f"{flag}: hand-written help"
    if action.default is not None:  # the default shown is the flag's own
        assert text.endswith(f" (default: {format_default(action.default)})")
    elif flag in SIM_SHOWN_DEFAULTS:
        assert text.endswith(f" (default: {SIM_SHOWN_DEFAULTS[flag]})")


def test_every_sim_flag_is_mapped_or_listed_as_hand_written() -> None:
    flags = set(options(sim_parser()))
    assert not SIM_FLAGS.keys() & SIM_HAND_WRITTEN
    assert flags == SIM_FLAGS.keys() | SIM_HAND_WRITTEN, "classify the new flag"


@pytest.mark.parametrize("flag", sorted(SIM_HAND_WRITTEN - {"-h", "--help"}))
def test_hand_written_sim_help_is_no_field_description(flag: str) -> None:
    text = shown(options(sim_parser())[flag])
    for model in DESCRIBED:
        for f in dataclasses.fields(model):
            assert not text.startswith(describe(model, f.name)), f"{flag}: map it in SIM_FLAGS"


@pytest.mark.parametrize("model", DESCRIBED, ids=lambda model: model.__name__)
def test_every_tuner_and_scaler_field_has_a_description(model: type) -> None:
    for f in dataclasses.fields(model):
        assert describe(model, f.name), f.name


def test_autoscale_fields_passed_to_the_scaler_share_its_description() -> None:
    for name, scaler_name in SCALER_FIELDS.items():
        assert describe(AutoscaleConfig, name) == describe(ScalerSettings, scaler_name)


def test_tuner_and_autoscale_flag_defaults_are_the_fields_defaults() -> None:
    """Unchanged behaviour: the flags left out give the fields' own defaults."""
    ns = sim_parser().parse_args(["sim", "--tune", "--max-batch", "16"])
    assert tune_config(ns) == TuneConfig(KnobBounds(0, 16, 0, 16), 30.0, TunerSettings())
    ns = sim_parser().parse_args(
        ["sim", "--autoscale", "--slo-ttft-p90", "2", "--target-output-tps", "10"]
    )
    assert autoscale_config(ns) == AutoscaleConfig(2.0, 10.0, 1, 32)
    ns = sim_parser().parse_args(["sim", "--tune", "--tune-rule", "literal"])
    config = tune_config(ns)
    assert config is not None and not config.settings.guarded


def test_cooldown_is_rounds_without_a_change_not_seconds() -> None:
    text = shown(options(sim_parser())["--tune-cooldown"])
    assert text.startswith("tuner rounds without a change after a change")
    assert "second" not in text and text.endswith("(default: 2)")


@pytest.mark.parametrize("parser", [worker_parser, sim_parser], ids=["worker", "sim"])
def test_tpot_budget_is_a_relative_inflation_not_seconds(
    parser: Callable[[], argparse.ArgumentParser],
) -> None:
    text = shown(options(parser())["--tpot-budget"])
    assert "relative TPOT inflation" in text and "unitless" in text
    assert "0.1: " in text and "10%" in text
    assert "second" not in text


def sim_command() -> argparse.ArgumentParser:
    """`genpool sim`'s own parser, whose help lists the flags."""
    commands = next(a for a in sim_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["sim"]


@pytest.mark.parametrize("parser", [worker_parser, sim_command], ids=["worker", "sim"])
def test_help_renders(parser: Callable[[], argparse.ArgumentParser]) -> None:
    out = " ".join(parser().format_help().split())  # argparse expands %% to %
    assert "relative TPOT inflation" in out and "by at most 10%" in out


def test_the_sim_help_keeps_per_request_units() -> None:
    flags = options(sim_parser())
    assert "output tokens/s per request" in shown(flags["--target-output-tps"])
    assert shown(flags["--target-output-tps"]).endswith("(default: auto)")
    assert shown(flags["--max-batch"]).startswith("B: ")


@dataclass(frozen=True)
class _Shape:
    size: int = field(default=3, metadata={DESCRIPTION: "a size, 100% requests"})
    bare: float = 0.5


class _Model(BaseModel):
    ratio: float = Field(default=0.25, description="a ratio, unitless")
    on: bool = Field(default=False, description="a switch")
    bare: int = 1


def test_help_for_formats_every_default_the_same_way() -> None:
    assert help_for(_Model, "ratio") == "a ratio, unitless (default: 0.25)"
    assert help_for(_Model, "on") == "a switch (default: off)"
    assert help_for(_Shape, "size", note="odd") == "a size, 100%% requests; odd (default: 3)"
    assert help_for(_Shape, "size", default=None) == "a size, 100%% requests"
    assert help_for(_Shape, "size", default=()) == "a size, 100%% requests"
    assert help_for(_Model, "ratio", default=[1.0, 2.5]) == "a ratio, unitless (default: 1,2.5)"
    assert format_default(30.0) == "30" and format_default("auto") == "auto"


@pytest.mark.parametrize(("model", "name"), [(_Shape, "bare"), (_Model, "bare")])
def test_a_field_without_a_description_is_refused(model: type, name: str) -> None:
    with pytest.raises(ValueError, match="no description"):
        describe(model, name)
    with pytest.raises(KeyError):
        describe(model, "missing")
