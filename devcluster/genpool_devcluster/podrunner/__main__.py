"""`python -m genpool_devcluster.podrunner`: scheduler + kubelet for one node, as local processes.

Started by `genpool devcluster up` with the admin kubeconfig; SIGTERM (or SIGINT) stops every pod
process and exits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from .containers import Backoff
from .runner import Runner


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m genpool_devcluster.podrunner", description=__doc__)
    p.add_argument("--kubeconfig", type=Path, required=True, help="admin kubeconfig file")
    p.add_argument(
        "--state-dir", type=Path, required=True, help="directory for pod dirs, logs, certificates"
    )
    p.add_argument(
        "--node-name",
        default="genpool-dev",
        help="the Node this runner registers (default: %(default)s)",
    )
    p.add_argument(
        "--kubelet-port",
        type=int,
        default=0,
        help="TCP port of the kubelet log server (0: any free)",
    )
    p.add_argument(
        "--backoff-initial",
        type=float,
        default=1.0,
        help="first crash back-off, seconds (default: %(default)s)",
    )
    p.add_argument(
        "--backoff-max",
        type=float,
        default=60.0,
        help="longest crash back-off, seconds (default: %(default)s)",
    )
    p.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="NAME",
        help="also pass this variable of the runner's environment to pods (repeatable)",
    )
    p.add_argument(
        "--no-scheduler",
        action="store_true",
        help="do not bind pending pods (another runner schedules; for tests)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s podrunner %(levelname)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
    runner = Runner(
        args.kubeconfig,
        args.state_dir,
        args.node_name,
        args.kubelet_port,
        Backoff(args.backoff_initial, args.backoff_max),
        args.pass_env,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: runner.stop.set())
    runner.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
