"""A container's termination message: the cause of a fatal exit, as Kubernetes keeps it
(pure; the worker writes it, the operator reads it back from the pod's status).

The kubelet keeps at most 4096 bytes of the file at ``terminationMessagePath``, and
status readers (the operator's Degraded condition, ``kubectl describe``) show its first
line, so the first line is the cause on its own and the rest is detail.
"""

from __future__ import annotations

# Where the kubelet mounts the termination-message file unless the container says otherwise.
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# Names the file instead of the default: the local pod runner, which cannot mount one at
# /dev/termination-log, passes its per-container file here (docs/podrunner.md).
TERMINATION_LOG_ENV = "GENPOOL_TERMINATION_LOG"
MAX_TERMINATION_MESSAGE_BYTES = 4096
MAX_CAUSE_CHARS = 300  # the first line; a status condition's message should stay readable


def termination_message(cause: str, detail: str = "") -> str:
    """``cause`` squeezed onto one line, then ``detail``, within the kubelet's limit."""
    first = " ".join(cause.split())[:MAX_CAUSE_CHARS] or "exited with an error"
    text = f"{first}\n{detail.strip()}\n" if detail.strip() else f"{first}\n"
    return truncate_utf8(text, MAX_TERMINATION_MESSAGE_BYTES)


def first_line(message: str) -> str:
    """The cause: the first non-blank line of a termination message."""
    for line in message.splitlines():
        if line.strip():
            return line.strip()[:MAX_CAUSE_CHARS]
    return ""


def truncate_utf8(text: str, max_bytes: int) -> str:
    """At most ``max_bytes`` of UTF-8, never splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", errors="ignore")
