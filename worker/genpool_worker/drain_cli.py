"""``genpool-worker-drain``: the worker pod's preStop hook.

POSTs ``/drain`` to the worker in the same pod and waits until it reports the in-flight
requests finished or the timeout passed. Standard library only: it starts in well under a
second, and it never waits much past the timeout (the pod's grace period is timeout + 5 s).
Exit 0 when drained, 1 otherwise (the pod stops either way).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from genpool_core.names import WORKER_PORT
from genpool_core.worker_env import ADMIN_TOKEN_ENV, DRAIN_TIMEOUT_ENV

DEFAULT_TIMEOUT_S = 110.0
# The HTTP wait may outlast the server's own deadline by this much (connect, response).
CLIENT_MARGIN_S = 3.0


def drain_url(environ: Mapping[str, str]) -> str:
    host = environ.get("POD_IP") or "127.0.0.1"
    if ":" in host:  # an IPv6 pod address
        host = f"[{host}]"
    port = environ.get("GENPOOL_PORT") or str(WORKER_PORT)
    return f"http://{host}:{port}/drain"


def default_timeout(environ: Mapping[str, str]) -> float:
    raw = environ.get(DRAIN_TIMEOUT_ENV)
    try:
        return float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        print(f"genpool-worker-drain: ignoring {DRAIN_TIMEOUT_ENV}={raw!r}", file=sys.stderr)
        return DEFAULT_TIMEOUT_S


def drain(url: str, timeout_s: float, token: str | None) -> tuple[bool, str]:
    """(drained, what happened)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = json.dumps({"timeout_s": timeout_s}).encode()
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s + CLIENT_MARGIN_S) as response:
            answer = json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}: {exc.read(500).decode(errors='replace')}"
    except (OSError, ValueError) as exc:  # refused, timed out, not JSON
        return False, f"{type(exc).__name__}: {exc}"
    drained = bool(answer.get("drained")) if isinstance(answer, dict) else False
    return drained, json.dumps(answer)


def main(argv: Sequence[str] | None = None) -> int:
    environ = os.environ
    parser = argparse.ArgumentParser(prog="genpool-worker-drain", description=__doc__)
    parser.add_argument(
        "--timeout",
        type=float,
        default=default_timeout(environ),
        help=f"seconds to wait for in-flight requests (env {DRAIN_TIMEOUT_ENV}, default 110)",
    )
    parser.add_argument("--url", default=drain_url(environ), help="the worker's /drain URL")
    args = parser.parse_args(argv)
    if not 0 < args.timeout <= 3600:
        parser.error("--timeout must be in (0, 3600]")
    drained, detail = drain(args.url, args.timeout, environ.get(ADMIN_TOKEN_ENV) or None)
    print(f"genpool-worker-drain: {'drained' if drained else 'not drained'}: {detail}")
    return 0 if drained else 1


if __name__ == "__main__":
    sys.exit(main())
