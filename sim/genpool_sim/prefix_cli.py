"""``genpool sim``'s conversation workload and prefix-caching flags (docs/sim.md#prefix-caching):
the options, their checks, the workload they describe. ``genpool_sim.cli`` runs it."""

from __future__ import annotations

import argparse

from genpool_core.field_help import field_default, help_for
from genpool_sim.cluster import ClusterConfig
from genpool_sim.conversations import ConversationSettings
from genpool_sim.experiment import Workload
from genpool_sim.gen_pass import LEAST_LOADED, ROUTERS
from genpool_sim.workload import TraceRequest

_CONVERSATION_FLAGS = {  # flag -> ConversationSettings field (after --conversations RATE)
    "--system-prompt-tokens": ("system_prompt_tokens", int),
    "--system-prompts": ("system_prompts", int),
    "--conv-turns": ("turns", float),
    "--conv-think-s": ("think_s", float),
    "--conv-message-scale": ("message_scale", float),
    "--conv-max-context": ("max_context_tokens", int),
}


class PrefixUsageError(ValueError):
    """A bad conversation or prefix-caching flag; the message names it."""


def _on_off(text: str) -> list[bool]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values or any(v not in ("on", "off") for v in values):
        raise argparse.ArgumentTypeError(f"expected on, off or on,off; got {text!r}")
    return [v == "on" for v in values]


def add_conversation_load(load: argparse._ActionsContainer) -> None:
    """``--conversations RATE``: one of the mutually exclusive loads."""
    load.add_argument("--conversations", type=float, metavar="RATE",
                      help=help_for(ConversationSettings, "rate"))  # fmt: skip


def add_prefix_options(sim: argparse.ArgumentParser) -> None:
    group = sim.add_argument_group("conversations and prefix caching (docs/sim.md)")
    for flag, (name, kind) in _CONVERSATION_FLAGS.items():
        group.add_argument(flag, type=kind, default=_default(name),
                           help=help_for(ConversationSettings, name,
                                         note="with --conversations"))  # fmt: skip
    group.add_argument("--colocated", action="store_true",
                       help=help_for(ClusterConfig, "colocated"))  # fmt: skip
    group.add_argument(
        "--prefix-caching",
        type=_on_off,
        default=[False],
        help=help_for(
            ClusterConfig,
            "prefix_caching",
            default=[False],
            note="on,off runs both on the same seeds",
        ),
    )
    group.add_argument("--router", choices=ROUTERS, default=LEAST_LOADED,
                       help=help_for(ClusterConfig, "router"))  # fmt: skip


def _default(name: str) -> object:
    return field_default(ConversationSettings, name)


def conversation_workload(ns: argparse.Namespace, trace: list[TraceRequest]) -> Workload:
    """The ``--conversations`` load (its lengths from the trace)."""
    values = {name: getattr(ns, flag[2:].replace("-", "_"))
              for flag, (name, _) in _CONVERSATION_FLAGS.items()}  # fmt: skip
    try:
        settings = ConversationSettings(ns.conversations, **values)
        return Workload(trace, conversations=settings, cv=ns.cv, duration_s=ns.duration,
                        warmup_s=ns.warmup)  # fmt: skip
    except ValueError as exc:
        raise PrefixUsageError(f"--conversations: {exc}") from None


def check_prefix_flags(ns: argparse.Namespace) -> None:
    """Refuse what the simulator does not model, in one line naming the flags."""
    is_caching = any(ns.prefix_caching)
    if is_caching and not ns.colocated:
        raise PrefixUsageError(
            "--prefix-caching on needs --colocated: caching is modelled where the prefill"
            " happens, in a GEN worker (the context stage has no KV model, and a decode"
            " worker's pulled prompt shares nothing)"
        )
    if is_caching and ns.kv_blocks is None:
        raise PrefixUsageError("--prefix-caching on needs --kv-blocks: cached blocks are KV")
    if ns.autoscale and (is_caching or ns.colocated or ns.conversations is not None):
        raise PrefixUsageError(
            "--autoscale runs the context stage and one load: drop --conversations,"
            " --colocated and --prefix-caching"
        )


def check_conversation_budget(config: ClusterConfig, workload: Workload) -> None:
    """A turn is at most ``--conv-max-context`` tokens; one worker's blocks must hold it."""
    budget, settings = config.kv_budget, workload.conversations
    if budget is None or settings is None:
        return
    needed = budget.blocks_for(settings.max_context_tokens)
    if needed > budget.num_blocks:
        raise PrefixUsageError(
            f"--kv-blocks {budget.num_blocks} x {budget.block_size} tokens cannot hold a turn"
            f" of --conv-max-context {settings.max_context_tokens} tokens ({needed} blocks)"
        )


def caching_label(name: str, is_caching: bool, ns: argparse.Namespace) -> str:
    """The scenario's name in the tables, with its caching when that varies or is on."""
    if len(ns.prefix_caching) > 1 or is_caching:
        return f"{name}, prefix caching {'on' if is_caching else 'off'}"
    return name
