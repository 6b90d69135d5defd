"""The worker's fatal error, written where Kubernetes reads a container's termination
message, so the cause reaches the pod's status (and the GenPool's Degraded condition)
without ``kubectl logs``."""

from __future__ import annotations

import logging
import os

from genpool_core.termination import (
    DEFAULT_TERMINATION_LOG,
    TERMINATION_LOG_ENV,
    termination_message,
)

log = logging.getLogger("genpool.worker")


def report_fatal(cause: str, detail: str = "") -> bool:
    """Write ``cause`` (one line) and ``detail`` to the termination log; True if written.

    The first fatal error wins: a tensor-parallel rank that failed keeps its own cause
    when rank 0 then reports the rank's exit. The default file exists only where a
    kubelet mounted it, so outside a pod nothing is created; a path given in
    ``$GENPOOL_TERMINATION_LOG`` is created when missing.
    """
    given = os.environ.get(TERMINATION_LOG_ENV)
    flags = os.O_RDWR | (os.O_CREAT if given else 0)
    try:
        fd = os.open(given or DEFAULT_TERMINATION_LOG, flags, 0o644)
    except OSError:
        return False
    with os.fdopen(fd, "r+b") as file:
        if os.fstat(fd).st_size > 0:
            return False
        try:
            file.write(termination_message(cause, detail).encode("utf-8"))
        except OSError as exc:  # a full or read-only file must not hide the original error
            log.warning("could not write the termination log: %s", exc)
            return False
    return True
