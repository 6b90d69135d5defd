"""One description per setting: a CLI flag that sets a field takes its help from it.

``describe(Model, "field")`` is a field's description: a pydantic model's
``Field(description=...)`` or a dataclass field's ``metadata={DESCRIPTION: ...}``.
``help_for(Model, "field")`` is an argparse help string made of it, an optional note
for what only that flag accepts, and the default, formatted the same way everywhere:
`` (default: X)``, with floats as ``%g``, booleans as on/off, lists comma-separated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

DESCRIPTION = "description"  # the key of a dataclass field's metadata


_OWN_DEFAULT = object()  # help_for shows the field's own default


def describe(model: type[Any], name: str) -> str:
    """The description of ``model``'s field ``name``; a field without one is an error."""
    text: object = None
    if isinstance(model, type) and issubclass(model, BaseModel):
        if name not in model.model_fields:
            raise KeyError(f"{model.__name__} has no field {name!r}")
        text = model.model_fields[name].description
    elif dataclasses.is_dataclass(model):
        fields = {f.name: f for f in dataclasses.fields(model)}
        if name not in fields:
            raise KeyError(f"{model.__name__} has no field {name!r}")
        text = fields[name].metadata.get(DESCRIPTION)
    else:
        raise TypeError(f"{model!r} is neither a pydantic model nor a dataclass")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{model.__name__}.{name} has no description")
    return text


def field_default(model: type[Any], name: str) -> object:
    """The field's plain default, or None (no default, or one made by a factory)."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        default = model.model_fields[name].default
        return None if default is PydanticUndefined else default
    for f in dataclasses.fields(model):
        if f.name == name:
            return None if f.default is dataclasses.MISSING else f.default
    raise KeyError(f"{model.__name__} has no field {name!r}")


def format_default(value: object) -> str:
    """A default as help shows it: 0.1, 30 (not 30.0), on/off, a,b for a list."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return ",".join(format_default(item) for item in value)
    return str(value)


def help_for(model: type[Any], name: str, *, default: object = _OWN_DEFAULT, note: str = "") -> str:
    """argparse help for the flag that sets ``model.name``: its description, ``note``
    (what only this flag accepts) and ``default`` (the field's own unless given; None or
    an empty list shows none: the description says what unset means). ``%`` is escaped
    for argparse."""
    text = describe(model, name)
    if note:
        text = f"{text}; {note}"
    shown = field_default(model, name) if default is _OWN_DEFAULT else default
    if shown is not None and shown != () and shown != []:  # an empty list shows none
        text = f"{text} (default: {format_default(shown)})"
    return text.replace("%", "%%")


__all__ = ["DESCRIPTION", "describe", "field_default", "format_default", "help_for"]
