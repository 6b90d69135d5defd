"""``genpool-worker`` flag validation: a clear one-line error and exit code 2."""

from __future__ import annotations

import pytest

from genpool_worker.worker_cli import main, parse_config


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preemption-mode", "target_output_tps"], "needs --target-output-tps"),
        (["--preemption-mode", "tpot_budget"], "needs --tpot-budget"),
        (["--preemption-mode", "fastest"], "preemption_mode"),
        (["--max-batch-size", "-3"], "max_batch_size"),
        (["--max-batch-size", "many"], "max_batch_size"),
        (["--target-output-tps", "0", "--preemption-mode", "target_output_tps"], "greater"),
        (["--port", "70000"], "port"),
        (["--paused-cap", "9", "--resident-headroom", "2", "--preemption-mode", "tpot_budget",
          "--tpot-budget", "0.1"], "paused_cap=9 exceeds"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("genpool-worker: error: ") and message in err


def test_flags_map_to_the_config() -> None:
    config = parse_config(
        ["--model", "synthetic:x", "--max-batch-size", "8", "--preemption-mode",
         "target_output_tps", "--target-output-tps", "18.5", "--max-resident-headroom", "6",
         "--no-stamp-arrival"]
    )  # fmt: skip
    assert config.max_batch_size == 8 and config.target_output_tps == 18.5
    assert config.stamp_arrival is False  # on by default (docs/design.md#keyed-by-default)
    assert config.preemption_settings()["target_output_tps"] == 18.5
    assert config.preemption_settings()["max_resident_headroom"] == 6


def test_every_flag_has_help_text() -> None:
    from genpool_worker.worker_cli import build_parser

    actions = [a for a in build_parser()._actions if a.dest != "help"]
    assert len(actions) > 20
    missing = [a.option_strings[0] for a in actions if not (a.help or "").strip()]
    assert missing == []


def test_help_loads_no_torch() -> None:
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from genpool_worker.worker_cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as exit:\n    assert exit.code == 0\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "--max-batch-size" in out.stdout and out.stdout.strip().endswith("False")
