"""The worker's command line and environment: ``genpool-worker``'s flags (one per
``WorkerConfig`` field) over the base config in GENPOOL_WORKER_CONFIG (the operator's
worker.json), validated whole into one ``WorkerConfig``."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence

from genpool_core.field_help import help_for
from genpool_core.worker_env import WORKER_CONFIG_ENV
from genpool_worker.worker_config import INHERITED_FLAGS, WorkerConfig

DESCRIPTION = "One GEN worker process: model, engine and HTTP API."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genpool-worker", description=DESCRIPTION)
    # The inherited flags come first in model_fields; --help lists the engine's first.
    fields = WorkerConfig.model_fields.items()
    for name, field in sorted(fields, key=lambda item: item[0] in INHERITED_FLAGS):
        flag = "--" + name.replace("_", "-")
        text = help_for(WorkerConfig, name)
        if field.annotation is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        else:
            parser.add_argument(flag, default=None, help=text)
    return parser


class ConfigEnvError(ValueError):
    """GENPOOL_WORKER_CONFIG is not a JSON object."""


def config_from_env(environ: Mapping[str, str]) -> dict[str, object]:
    """The base config from GENPOOL_WORKER_CONFIG (the operator's worker.json), or {}."""
    raw = environ.get(WORKER_CONFIG_ENV, "").strip()
    if not raw:
        return {}
    try:
        loaded = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigEnvError(f"{WORKER_CONFIG_ENV} is not valid JSON: {exc}") from None
    if not isinstance(loaded, dict):
        kind = type(loaded).__name__
        raise ConfigEnvError(f"{WORKER_CONFIG_ENV} must be a JSON object, got {kind}")
    return loaded


def parse_config(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None
) -> WorkerConfig:
    """GENPOOL_WORKER_CONFIG first, then the flags given on the command line over it."""
    base = config_from_env(os.environ if environ is None else environ)
    ns = build_parser().parse_args(argv)
    given = {k: v for k, v in vars(ns).items() if v is not None}
    return WorkerConfig.model_validate({**base, **given})
