"""Termination messages, filled as the kubelet fills them.

Each run of a container gets a fresh, empty file; its host path reaches the process in
``$GENPOOL_TERMINATION_LOG`` because a plain process cannot see a file mounted at the
container's ``terminationMessagePath``. When the run ends, the status's
``terminated.message`` is the file's first 4096 bytes; with ``terminationMessagePolicy:
FallbackToLogsOnError``, an empty file and a non-zero exit, it is the run's log tail
instead (the last 80 lines, at most 2048 bytes), as in the kubelet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from genpool_core.termination import MAX_TERMINATION_MESSAGE_BYTES, truncate_utf8

from .kubelet_api import Entry

Obj = dict[str, Any]
FALLBACK_MAX_LINES = 80
FALLBACK_MAX_BYTES = 2048
TAIL_READ_BYTES = 256 * 1024  # enough for 80 lines of ordinary length


def fresh_message_file(directory: Path, run_index: int) -> Path:
    """An empty file for one run's termination message."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{run_index}.message"
    path.write_bytes(b"")
    return path


def termination_message(spec: Obj, message_file: Path | None, log_file: Path, code: int) -> str:
    """What the kubelet would put in ``state.terminated.message`` for this run."""
    message = _read_head(message_file, MAX_TERMINATION_MESSAGE_BYTES) if message_file else ""
    fallback = spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
    if not message and fallback and code != 0:
        message = log_tail(log_file, FALLBACK_MAX_LINES, FALLBACK_MAX_BYTES)
    return message


def log_tail(log_file: Path, max_lines: int, max_bytes: int) -> str:
    """The last ``max_lines`` lines of a CRI-format run log, then its last ``max_bytes``."""
    try:
        with log_file.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - TAIL_READ_BYTES))
            raw = fh.read()
    except OSError:
        return ""
    lines = raw.split(b"\n")
    if size > TAIL_READ_BYTES:
        lines = lines[1:]  # the first may be cut mid-entry
    text = b"".join(Entry(line).render(timestamps=False) for line in lines if line)
    kept = b"\n".join(text.split(b"\n")[-max_lines - 1 :])  # (the text ends with "\n")
    return kept[-max_bytes:].decode("utf-8", errors="replace")


def _read_head(path: Path, max_bytes: int) -> str:
    try:
        with path.open("rb") as fh:
            data = fh.read(max_bytes)
    except OSError:
        return ""
    return truncate_utf8(data.decode("utf-8", errors="replace"), max_bytes)
