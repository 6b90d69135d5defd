"""A termination message: the cause on its first line, within the kubelet's 4096 bytes."""

from __future__ import annotations

from genpool_core.termination import (
    MAX_TERMINATION_MESSAGE_BYTES,
    first_line,
    termination_message,
    truncate_utf8,
)


def test_the_first_line_is_the_cause_on_one_line() -> None:
    message = termination_message("bad\n  config:   x\tmust be > 0", "Traceback\n  line\n")
    assert message == "bad config: x must be > 0\nTraceback\n  line\n"
    assert first_line(message) == "bad config: x must be > 0"
    assert termination_message("") == "exited with an error\n"


def test_the_message_fits_the_kubelet_limit_without_splitting_a_character() -> None:
    message = termination_message("cause", "é" * 5000)
    assert len(message.encode("utf-8")) <= MAX_TERMINATION_MESSAGE_BYTES
    assert message.startswith("cause\n") and message.endswith("é")
    assert truncate_utf8("aé", 2) == "a"


def test_first_line_skips_blank_lines() -> None:
    assert first_line("\n\n  model load failed  \nmore") == "model load failed"
    assert first_line("  \n") == ""
