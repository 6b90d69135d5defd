"""``genpool-operator``: run the kopf operator for GenPool resources."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from genpool_core.names import OPERATOR_METRICS_PORT

DNS_LABEL_MAX = 63


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="genpool-operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable); default: the pod's own namespace",
    )
    scope.add_argument(
        "--all-namespaces", action="store_true", help="watch GenPools in every namespace"
    )
    parser.add_argument(
        "--liveness-port",
        type=int,
        default=8080,
        help="TCP port of kopf's /healthz (0: off; default: %(default)s)",
    )
    parser.add_argument(
        "--liveness-host",
        default=os.environ.get("POD_IP", "127.0.0.1"),
        help="IP address of /healthz (default: $POD_IP, else 127.0.0.1)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=OPERATOR_METRICS_PORT,
        help="TCP port of the Prometheus /metrics (0: off; default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-host",
        default=os.environ.get("POD_IP", "127.0.0.1"),
        help="IP address of /metrics (default: $POD_IP, else 127.0.0.1)",
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        help="kopf peering object for running more than one replica (HA); off: standalone",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=0,
        help="peering priority, an integer: the highest live one runs (default: %(default)s)",
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag, port in (
        ("--liveness-port", args.liveness_port),
        ("--metrics-port", args.metrics_port),
    ):
        if not 0 <= port <= 65535:
            parser.error(f"{flag} {port} is not a port")
    if args.metrics_port and args.metrics_port == args.liveness_port:
        parser.error("--metrics-port and --liveness-port must differ")
    for namespace in args.namespace:
        if not namespace or len(namespace) > DNS_LABEL_MAX or not _is_dns_label(namespace):
            parser.error(f"--namespace {namespace!r} is not a valid namespace name")
    if args.peering is not None and not _is_dns_label(args.peering):
        parser.error(f"--peering {args.peering!r} is not a valid object name")
    if not args.all_namespaces and not args.namespace:
        own = os.environ.get("POD_NAMESPACE")
        if not own:
            parser.error("give --namespace NS (repeatable) or --all-namespaces")
        args.namespace = [own]
    return args


def _is_dns_label(text: str) -> bool:
    return (
        0 < len(text) <= DNS_LABEL_MAX
        and text[0].isalnum()
        and text[-1].isalnum()
        and all(c.islower() or c.isdigit() or c == "-" for c in text)
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    import kopf

    import genpool_operator.handlers  # noqa: F401  (registers the handlers)
    from genpool_operator import metrics

    if args.metrics_port:
        metrics.serve(args.metrics_host, args.metrics_port)

    liveness = (
        f"http://{args.liveness_host}:{args.liveness_port}/healthz" if args.liveness_port else None
    )
    kopf.run(
        clusterwide=args.all_namespaces,
        namespaces=args.namespace,
        liveness_endpoint=liveness,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
