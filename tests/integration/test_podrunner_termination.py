"""Termination messages from the pod runner, as the kubelet fills them: the file at
the container's terminationMessagePath (here: $GENPOOL_TERMINATION_LOG), or with
FallbackToLogsOnError the log's tail (real apiserver, real processes)."""

from __future__ import annotations

from kubernetes import client

from genpool_core.termination import TERMINATION_LOG_ENV
from tests.integration.podrunner_support import pod, read, wait_phase
from tests.polling import wait_for


def _exited(core: client.CoreV1Api, ns: str, name: str) -> client.V1ContainerStateTerminated:
    pod_ = wait_phase(core, ns, name, ("Succeeded", "Failed"))
    terminated = pod_.status.container_statuses[0].state.terminated
    assert terminated is not None
    return terminated


def test_the_message_file_becomes_the_terminated_message(core: client.CoreV1Api, ns: str) -> None:
    message = "bad config: x must be > 0\\nmore"
    script = (
        "import os, sys\n"
        f"open(os.environ[{TERMINATION_LOG_ENV!r}], 'w').write('{message}')\n"
        "print('log line, not the message')\n"
        "sys.exit(2)\n"
    )
    core.create_namespaced_pod(ns, pod("writes", ["python", "-c", script], restartPolicy="Never"))
    terminated = _exited(core, ns, "writes")
    assert terminated.exit_code == 2
    assert terminated.reason == "Error"
    assert terminated.message == "bad config: x must be > 0\nmore"


def test_fallback_to_logs_on_error_takes_the_log_tail(core: client.CoreV1Api, ns: str) -> None:
    # 100 lines: the kubelet keeps the last 80, then the last 2048 bytes of those.
    script = "import sys\nfor i in range(100): print(f'line {i:03d}', flush=True)\nsys.exit(3)\n"
    manifest = pod(
        "falls-back",
        ["python", "-c", script],
        restartPolicy="Never",
        container={"terminationMessagePolicy": "FallbackToLogsOnError"},
    )
    core.create_namespaced_pod(ns, manifest)
    terminated = _exited(core, ns, "falls-back")
    assert terminated.exit_code == 3
    lines = terminated.message.splitlines()
    assert lines[0] == "line 020" and lines[-1] == "line 099" and len(lines) == 80


def test_fallback_is_only_for_failures_and_file_policy_never_reads_logs(
    core: client.CoreV1Api, ns: str
) -> None:
    ok = pod(
        "ok",
        ["python", "-c", "print('done')"],
        restartPolicy="Never",
        container={"terminationMessagePolicy": "FallbackToLogsOnError"},
    )
    file_only = pod("file-only", ["python", "-c", "print('oops'); raise SystemExit(1)"],
                    restartPolicy="Never")  # fmt: skip
    core.create_namespaced_pod(ns, ok)
    core.create_namespaced_pod(ns, file_only)
    done = _exited(core, ns, "ok")
    assert (done.exit_code, done.reason, done.message) == (0, "Completed", None)
    failed = _exited(core, ns, "file-only")
    assert (failed.exit_code, failed.reason, failed.message) == (1, "Error", None)


def test_a_crash_loop_keeps_the_message_in_last_state(core: client.CoreV1Api, ns: str) -> None:
    script = (
        "import os\n"
        f"open(os.environ[{TERMINATION_LOG_ENV!r}], 'w').write('model load failed')\n"
        "raise SystemExit(1)\n"
    )
    core.create_namespaced_pod(ns, pod("loops", ["python", "-c", script]))

    def looping() -> client.V1ContainerStatus | None:
        status = (read(core, ns, "loops").status.container_statuses or [None])[0]
        waiting = status and status.state.waiting
        return status if waiting and waiting.reason == "CrashLoopBackOff" else None

    status = wait_for(looping, "CrashLoopBackOff", 60)
    assert status.last_state.terminated.message == "model load failed"
    assert status.last_state.terminated.reason == "Error"
