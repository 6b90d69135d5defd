"""Build worker/Dockerfile and operator/Dockerfile into image archives, with no registry.

The devcluster's node runs pods from containerd, which takes images from archives
(`ctr -n k8s.io images import`). Docker Hub is out of reach, so the Dockerfiles' default
base (python:3.11-slim-bookworm) is replaced by one debootstrapped from the host's Debian
mirror: bookworm's python3 is the same 3.11. buildah builds the Dockerfiles unmodified on
it and writes docker-archive tars named docker.io/genpool/<kind>:<tag>, keyed by content so
an unchanged tree costs nothing. pip inside the build gets the host CA bundle as a build
secret (in no layer, in no cache key). Everything lives under IMAGES_DIR: buildah's own
store (storage/, run/) and the archives. docs/devcluster.md#images.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from . import build
from .node import packages as host_packages

IMAGES_DIR = Path(os.environ.get("GENPOOL_IMAGES_CACHE", "~/.cache/genpool/images")).expanduser()
KINDS = ("worker", "operator")
SUITE = "bookworm"
# minbase is the "required" priority plus apt: passwd (groupadd/useradd, which the
# Dockerfiles' runtime stages call) is "required", so it is in without being named.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_REPO = "localhost/genpool/base"
# The name containerd will know it by, and so the one the pods' image fields resolve to:
# "genpool/worker:0.1.0" (the operator's default, the chart's values) means docker.io/....
IMAGE_REPO = "docker.io/genpool"
# Native overlay works as root on this ext4 (checked: buildah mount of a scratch container);
# vfs would copy every layer in full, GBs per step for the worker.
STORAGE_DRIVER = "overlay"
# The Dockerfiles' optional build secret (RUN --mount=type=secret,id=pip_cert).
CA_SECRET = "pip_cert"
SOURCES_FILES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
CA_ENV = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
CA_DEFAULT = Path("/etc/ssl/certs/ca-certificates.crt")
# What a first build takes here, for the progress lines (docs/devcluster.md#images).
FIRST_TIME = {"base": "~1 min", "worker": "~7 min", "operator": "~30 s"}


# ---- pure builders -----------------------------------------------------------------


def parse_mirror(text: str, suite: str = SUITE) -> str | None:
    """The archive URI serving `suite` in an APT sources file, deb822 or one-line format
    (the security archive serves bookworm-security, not bookworm, so it is never picked)."""
    if re.search(r"^\s*Types:", text, re.MULTILINE):
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, list[str]] = {}
            for line in stanza.splitlines():
                key, sep, value = line.partition(":")
                if sep and not line.startswith(("#", " ", "\t")):
                    fields[key.strip().lower()] = value.split()
            if "deb" in fields.get("types", []) and suite in fields.get("suites", []):
                return fields.get("uris", [None])[0]
        return None
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", " ", line.partition("#")[0]).split()
        if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
            return words[1]
    return None


def base_name(packages: Iterable[str] = BASE_PACKAGES, suite: str = SUITE) -> str:
    """The base image's name: a new package list is a new image, never a stale cache hit."""
    recipe = "\n".join(["minbase", suite, *sorted(packages)])
    return f"{BASE_REPO}:{suite}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def image_name(kind: str, tag: str) -> str:
    return f"{IMAGE_REPO}/{kind}:{tag}"


def parse_app_version(chart_yaml: str) -> str:
    """The chart's appVersion: the images' tag (the operator's default worker image and the
    chart's operator image are genpool/<kind>:<appVersion>)."""
    m = re.search(r"""^appVersion:\s*["']?([^"'\s]+)""", chart_yaml, re.MULTILINE)
    if not m:
        raise ValueError("no appVersion in Chart.yaml")
    return m.group(1)


def copy_sources(dockerfile: str) -> list[str]:
    """The build-context paths a Dockerfile's COPY lines read (not COPY --from=stage)."""
    joined = re.sub(r"\\\n", " ", re.sub(r"^\s*#.*\n", "", dockerfile, flags=re.MULTILINE))
    sources: list[str] = []
    for line in joined.splitlines():
        if line.split(None, 1)[:1] != ["COPY"]:  # shlex only on COPY: RUN lines may not parse
            continue
        words = shlex.split(line)
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from=") for w in words[1:]) or len(args) < 2:
            continue
        sources += [s for s in args[:-1] if s not in sources]
    return sources


def is_copied(rel: str) -> bool:
    """Bytecode is left out (.dockerignore drops it too): running the tests must not look
    like a code change."""
    parts = rel.split("/")
    return "__pycache__" not in parts and not rel.endswith(".pyc")


def content_key(dockerfile: str, files: Iterable[tuple[str, bytes]], base_id: str, tag: str) -> str:
    """What the image is built from: the Dockerfile, each copied file (path and bytes), the
    base image and the tag (it is inside the archive, as the image's name)."""
    h = hashlib.sha256()
    for part in (dockerfile.encode(), base_id.encode(), tag.encode()):
        h.update(len(part).to_bytes(8, "big") + part)
    for rel, data in sorted(files):
        for part in (rel.encode(), data):
            h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()[:16]


def buildah_argv(images_dir: Path, *args: str) -> list[str]:
    """A buildah call on the cache's private store: nothing touches the host's own
    /var/lib/containers, and deleting IMAGES_DIR deletes everything."""
    store = ["--root", str(images_dir / "storage"), "--runroot", str(images_dir / "run")]
    return ["buildah", *store, "--storage-driver", STORAGE_DRIVER, *args]


def debootstrap_argv(
    rootfs: Path, mirror: str, packages: Iterable[str] = BASE_PACKAGES
) -> list[str]:
    include = f"--include={','.join(packages)}"
    return ["debootstrap", "--variant=minbase", include, SUITE, str(rootfs), mirror]


def bud_argv(
    images_dir: Path, kind: str, repo_root: Path, tag: str, base: str, ca_file: Path | None
) -> list[str]:
    """--layers keeps each step cached in the store (a code edit re-runs the wheel and the
    final install, not the torch download); --force-rm: a failed build leaves no container
    (a half-done pip install is GBs); --pull=never: the base is local and nothing else is
    pulled; --network=host: pip reaches PyPI the way the host does."""
    flags = ["--layers", "--force-rm", "--pull=never", "--network=host"]
    flags += ["--build-arg", f"BASE_IMAGE={base}"]
    if ca_file:
        flags += ["--secret", f"id={CA_SECRET},src={ca_file}"]
    dockerfile, name = str(repo_root / kind / "Dockerfile"), image_name(kind, tag)
    return buildah_argv(images_dir, "bud", *flags, "-f", dockerfile, "-t", name, str(repo_root))


def push_argv(images_dir: Path, name: str, archive: Path) -> list[str]:
    """docker-archive: its manifest names the image, so `ctr images import` tags it as
    `name` with no --base-name (an oci-archive carries only the tag)."""
    return buildah_argv(images_dir, "push", "--quiet", name, f"docker-archive:{archive}:{name}")


def ca_candidates(env: Mapping[str, str]) -> list[Path]:
    """Where the host's own pip finds its CA bundle, in order: its env settings, then
    Debian's bundle. Behind a TLS-intercepting proxy that bundle holds the proxy's CA."""
    return [*(Path(env[k]) for k in CA_ENV if env.get(k)), CA_DEFAULT]


# ---- I/O ---------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[devcluster images] {msg}", file=sys.stderr, flush=True)


@contextmanager
def _step(what: str) -> Iterator[None]:
    start = time.monotonic()
    log(f"{what} ...")
    yield
    log(f"{what} done in {time.monotonic() - start:.0f} s")


def _run(argv: list[str], log_file: Path | None = None) -> str:
    """Run argv; its output goes to log_file when given (a build's thousands of lines),
    and a failure shows the tail. buildah stages GBs in TMPDIR (/var/tmp by default: 11 GB
    during the worker's build): kept under IMAGES_DIR, where _clean_tmp finds a killed
    build's leftovers."""
    env = {**os.environ, "TMPDIR": str(IMAGES_DIR / "tmp")}
    if log_file is None:
        res = subprocess.run(argv, capture_output=True, text=True, env=env)
        out, err = res.stdout, res.stderr
    else:
        with open(log_file, "w") as fh:
            res = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, text=True, env=env)
        out, err = "", log_file.read_text(errors="replace")
    if res.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({res.returncode}):\n{err[-4000:]}")
    return out


def _clean_tmp() -> None:
    """Called under the lock, when nothing is using the temp dir: what a killed build left
    there (GBs of buildah staging, a half-written archive) goes."""
    shutil.rmtree(IMAGES_DIR / "tmp", ignore_errors=True)
    (IMAGES_DIR / "tmp").mkdir(parents=True)


def _locked() -> contextlib.AbstractContextManager[None]:
    """One builder at a time: two buildah builds on one store would fight over it, and two
    `up`s must not both download torch."""
    return build.file_lock(IMAGES_DIR / "build.lock", log)


def host_mirror() -> str:
    """The Debian mirror the host's apt uses: read here, never written into the repo."""
    for path in SOURCES_FILES:
        if path.is_file() and (uri := parse_mirror(path.read_text())):
            return uri
    raise RuntimeError(f"no deb line for {SUITE} in {', '.join(map(str, SOURCES_FILES))}")


def host_ca_file() -> Path | None:
    return next((p for p in ca_candidates(os.environ) if p.is_file()), None)


def image_id(name: str) -> str | None:
    argv = buildah_argv(IMAGES_DIR, "images", "--quiet", "--no-trunc", name)
    res = subprocess.run(argv, capture_output=True, text=True)
    return res.stdout.split()[0] if res.returncode == 0 and res.stdout.strip() else None


def _pack_rootfs(rootfs: Path, name: str) -> None:
    """rootfs -> image: a scratch container, the tree copied into its mount, committed."""
    cid = _run(buildah_argv(IMAGES_DIR, "from", "scratch")).strip()
    try:
        mnt = _run(buildah_argv(IMAGES_DIR, "mount", cid)).strip()
        _run(["cp", "-a", f"{rootfs}/.", mnt])
        _run(buildah_argv(IMAGES_DIR, "umount", cid))
        config = ["--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
        config += ["--env", "LANG=C.UTF-8", "--cmd", "/bin/bash"]
        _run(buildah_argv(IMAGES_DIR, "config", *config, cid))
        _run(buildah_argv(IMAGES_DIR, "commit", "--quiet", cid, name))
    finally:
        subprocess.run(buildah_argv(IMAGES_DIR, "rm", cid), capture_output=True)


def _ensure_base() -> str:
    name = base_name()
    if image_id(name):
        return name
    rootfs = IMAGES_DIR / "rootfs.tmp"
    shutil.rmtree(rootfs, ignore_errors=True)
    try:
        with _step(f"base: debootstrap {SUITE} (first time {FIRST_TIME['base']})"):
            _run(debootstrap_argv(rootfs, host_mirror()), IMAGES_DIR / "base-debootstrap.log")
        # The .debs and package lists are apt's cache: no build step uses apt (pip installs).
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        with _step(f"base: buildah commit {name}"):
            _pack_rootfs(rootfs, name)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)  # packed (or failed): a copy too many
    return name


def ensure_base() -> str:
    """The local base image (Debian bookworm minbase + python3, venv, CA certificates),
    built once from the host's Debian mirror; its name."""
    with _locked():
        _clean_tmp()
        return _ensure_base()


def copied_files(repo_root: Path, sources: Iterable[str]) -> list[tuple[str, bytes]]:
    """(path, bytes) of every file the COPY lines bring in, bytecode left out."""
    files: list[tuple[str, bytes]] = []
    for src in sources:
        top = repo_root / src
        paths = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
        for path in paths:
            rel = path.relative_to(repo_root).as_posix()
            if is_copied(rel):
                files.append((rel, path.read_bytes()))
    return files


def ensure_image(kind: str, repo_root: Path, tag: str) -> Path:
    """The docker-archive of `kind` (worker or operator) built from repo_root's Dockerfile,
    named docker.io/genpool/<kind>:<tag>: the cached one when nothing it is built from
    changed, else built now (older archives of `kind` are deleted)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
    with _locked():
        _clean_tmp()
        base = _ensure_base()
        dockerfile = (repo_root / kind / "Dockerfile").read_text()
        files = copied_files(repo_root, copy_sources(dockerfile))
        key = content_key(dockerfile, files, image_id(base) or base, tag)
        archive = IMAGES_DIR / f"{kind}-{key}.tar"
        if archive.exists():
            log(f"{kind}: {archive.name} is up to date")
            return archive
        name = image_name(kind, tag)
        argv = bud_argv(IMAGES_DIR, kind, repo_root, tag, base, host_ca_file())
        with _step(f"{kind}: buildah bud (first time {FIRST_TIME[kind]})"):
            _run(argv, IMAGES_DIR / f"{kind}-build.log")
        tmp = IMAGES_DIR / "tmp" / archive.name  # a killed push's leftover: see _clean_tmp
        with _step(f"{kind}: buildah push {name} -> {archive.name}"):
            _run(push_argv(IMAGES_DIR, name, tmp))
        os.replace(tmp, archive)  # a reader never sees a half-written archive
        for old in IMAGES_DIR.glob(f"{kind}-*.tar"):
            if old != archive:
                old.unlink()
        return archive


def ensure_images(repo_root: Path, kinds: Iterable[str] = KINDS) -> list[Path]:
    """The archives (worker, operator) tagged with the chart's appVersion: the names the
    chart and the operator's default worker image ask for."""
    tag = parse_app_version((repo_root / "charts/genpool/Chart.yaml").read_text())
    return [ensure_image(kind, repo_root, tag) for kind in kinds]


def main(argv: list[str]) -> int:
    """python -m genpool_devcluster.images [worker|operator]: build (or find) the archives
    and print their paths."""
    unknown = sorted(set(argv) - set(KINDS))
    if unknown:
        print(f"unknown image kind {', '.join(unknown)}: expected {' or '.join(KINDS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    host_packages.ensure()  # buildah, debootstrap
    repo_root = Path(__file__).resolve().parents[2]
    print("\n".join(map(str, ensure_images(repo_root, argv or KINDS))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
