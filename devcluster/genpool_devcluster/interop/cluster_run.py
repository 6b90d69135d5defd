"""``run``: the same checks as ``local`` on the local control plane: the operator (Helm
chart), a P/D GenPool with an InferencePool, a colocated reference pool (the reference
text), llm-d's epp for the InferencePool and its sidecar in front of the decode pod."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genpool_devcluster.interop.children import epp_proc, running, sidecar_proc
from genpool_devcluster.interop.common import (
    NAMESPACE,
    POOL,
    PREFILL_HEADER,
    PROMPTS,
    REF_POOL,
    ROOT,
    WORKER_PORT,
    finish,
    http_ok,
    import_counts,
    log,
    wait_for,
)
from genpool_devcluster.interop.epp_client import pd_completion
from genpool_devcluster.interop.epp_config import EPP_PD_CONFIG
from genpool_devcluster.interop.forwarder import Forwarder
from genpool_devcluster.procs import free_port

if TYPE_CHECKING:
    from genpool_devcluster.demo import Tools


def _pd_specs(model: str) -> dict[str, dict[str, Any]]:
    import yaml

    pd = yaml.safe_load((ROOT / "examples" / "genpool-pd.yaml").read_text())["spec"]
    pd["model"] = model
    pd["preemption"] = {"mode": "Off"}  # greedy text vs the reference: no pauses needed
    pd["inferencePool"] = {"enabled": True,
                           "endpointPickerRef": {"name": "pd-epp", "port": 9002}}  # fmt: skip
    if model.startswith("synthetic:"):
        for section in (pd, pd["prefill"]):
            section["resources"] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    ref = {k: v for k, v in pd.items() if k not in ("prefill", "inferencePool")}
    return {POOL: pd, REF_POOL: ref}


def pods_of(tools: Tools, pool: str) -> list[dict[str, Any]]:
    from genpool_core.names import pool_label_selector

    out = tools.run("kubectl", "get", "pods", "-n", NAMESPACE, "-l", pool_label_selector(pool),
                    "-o", "json")  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def _ready_ip(tools: Tools, pool: str, role: str | None) -> str | None:
    for pod in pods_of(tools, pool):
        labels = pod["metadata"].get("labels") or {}
        if labels.get("llm-d.ai/role") != role:
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            ip: str | None = pod["status"].get("podIP")
            return ip
    return None


@dataclass
class PodIPs:
    decode: str
    prefill: str
    ref: str


def control_plane(state_dir: Path) -> Tools | None:
    """The devcluster of ``state_dir`` up (None when it does not come up), as kubectl and
    helm see it."""
    from genpool_devcluster import build, cli
    from genpool_devcluster.demo import Tools

    build.ensure_binaries()
    if cli.main(["up", "--state-dir", str(state_dir)]) != 0:
        return None
    return Tools(state_dir.expanduser() / "kubeconfig")


def install(tools: Tools) -> None:
    """The InferencePool CRD (inference.networking.k8s.io/v1), the operator (Helm chart)."""
    from genpool_devcluster.demo import _install_operator

    crd = ROOT / "tests" / "data" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
    tools.run("kubectl", "apply", "--server-side", "-f", str(crd))
    tools.run("kubectl", "wait", "--for=condition=Established", "--timeout=60s",
              "crd/inferencepools.inference.networking.k8s.io")  # fmt: skip
    _install_operator(tools)


def _apply_pools(tools: Tools, model: str) -> PodIPs:
    """Both GenPools applied; their ready pods' IPs."""
    import yaml

    from genpool_core.names import API_KIND, GROUP_VERSION

    log(f"[3/6] GenPools {POOL} (P/D, {model}) and {REF_POOL} (colocated reference)")
    tools.run("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))  # fmt: skip
    for name, spec in _pd_specs(model).items():
        manifest = {"apiVersion": GROUP_VERSION, "kind": API_KIND,
                    "metadata": {"name": name}, "spec": spec}  # fmt: skip
        tools.run("kubectl", "apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))
    decode_ip = wait_for(lambda: _ready_ip(tools, POOL, "decode"), "a ready decode pod", 600, 2)
    prefill_ip = wait_for(lambda: _ready_ip(tools, POOL, "prefill"), "a ready prefill pod", 600,
                          2)  # fmt: skip
    ref_ip = wait_for(lambda: _ready_ip(tools, REF_POOL, None), "a ready reference pod", 600, 2)
    log(f"  decode {decode_ip}, prefill {prefill_ip}, reference {ref_ip}")
    return PodIPs(decode_ip, prefill_ip, ref_ip)


def _check_prompts(args: argparse.Namespace, ips: PodIPs, epp_address: str, sidecar: str
                   ) -> list[str]:  # fmt: skip
    """Each prompt: the epp's pick over ext_proc, then the SDK to the sidecar; the failures."""
    import httpx
    import openai

    log("[5/6] requests: the epp's pick over ext_proc, then the SDK to the sidecar")
    ref_sdk = openai.OpenAI(base_url=f"http://{ips.ref}:{WORKER_PORT}/v1",
                            api_key="unused", max_retries=0)  # fmt: skip

    def imports() -> float:
        text = httpx.get(f"http://{ips.decode}:{WORKER_PORT}/metrics", timeout=10).text
        return import_counts(text).get("import/ok", 0.0)

    # diagnostic only: Host: <the pull address the handle should carry>
    extra = {"Host": f"{ips.prefill}:{WORKER_PORT}"} if args.host_override else {}
    failures: list[str] = []
    for prompt in PROMPTS:
        body = {"model": args.model, "prompt": prompt, "max_tokens": args.max_tokens,
                "temperature": 0}  # fmt: skip
        want = ref_sdk.completions.create(**body).choices[0].text
        before = imports()
        text, picked, prefiller = asyncio.run(pd_completion(epp_address, sidecar, body, extra))
        after = imports()
        log(
            f"  {prompt[:30]!r}: epp decode {picked}, {PREFILL_HEADER} {prefiller!r}; "
            f"P/D {text!r}, reference {want!r}; import ok {before:g} -> {after:g}"
        )
        if picked != f"{ips.decode}:{WORKER_PORT}":
            failures.append(f"epp picked {picked}, not the decode pod {ips.decode}")
        if not prefiller.startswith(f"{ips.prefill}:"):
            failures.append(f"epp's prefiller {prefiller!r} is not {ips.prefill}")
        if text != want:
            failures.append(f"{prompt!r}: P/D text {text!r} != reference {want!r}")
        if after != before + 1:
            failures.append(f"{prompt!r}: import ok {before:g} -> {after:g}, not +1")
    return failures


def run(args: argparse.Namespace) -> int:
    bin_dir: Path = args.bin
    log(f"[1/6] control plane ({args.state_dir})")
    tools = control_plane(args.state_dir)
    if tools is None:
        return 1
    log("[2/6] InferencePool CRD (inference.networking.k8s.io/v1), operator (Helm chart)")
    install(tools)
    ips = _apply_pools(tools, args.model)

    log("[4/6] llm-d epp (P/D config) and pd-sidecar in front of the decode pod")
    epp, grpc_port, metrics_port = epp_proc(
        bin_dir, EPP_PD_CONFIG, pool=POOL, namespace=NAMESPACE, kubeconfig=tools.kubeconfig
    )
    forwarder = Forwarder((ips.decode, WORKER_PORT))
    side_port = free_port()
    side = sidecar_proc(bin_dir, side_port, forwarder.port)
    sidecar = f"http://127.0.0.1:{side_port}"
    failures: list[str] = []
    try:
        with ExitStack() as stack:
            health = f"{sidecar}/health"
            stack.enter_context(running(side, lambda: http_ok(health), "the sidecar serving", 60))
            metrics = f"http://127.0.0.1:{metrics_port}/metrics"
            stack.enter_context(running(epp, lambda: http_ok(metrics), "the epp serving", 120))
            time.sleep(5)  # its pod list and first scrape
            failures = _check_prompts(args, ips, f"127.0.0.1:{grpc_port}", sidecar)
    finally:
        forwarder.close()
        for proc in (side, epp):
            print(f"---- {proc.name} log tail ({proc.log_path})\n{proc.tail(15)}")
        if not args.keep:
            for name in (POOL, REF_POOL):
                tools.run("kubectl", "delete", "gp", name, "-n", NAMESPACE, "--ignore-not-found",
                          "--wait=true")  # fmt: skip
    return finish(failures, "[6/6] ")
