"""The pod sandbox ("pause") image, made here: nothing can be pulled on these machines.

A 20-line C program, linked statically with the host's gcc, packed by hand into an OCI
image archive that `ctr images import` reads. Cached under the devcluster cache by the
source's digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from . import oci
from .configs import PAUSE_IMAGE

# Sleeps until told to stop; reaps the pod's orphans (it is PID 1 of the pod's namespace).
PAUSE_C = r"""
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

static void on(int sig, void (*fn)(int), int flags) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fn;
  sa.sa_flags = flags;
  sigaction(sig, &sa, NULL);
}

int main(void) {
  on(SIGINT, stop, 0);
  on(SIGTERM, stop, 0);
  on(SIGCHLD, reap, SA_NOCLDSTOP);
  for (;;) pause();
}
"""


def _layer(binary: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("pause")
        info.size, info.mode = len(binary), 0o755
        tar.addfile(info, io.BytesIO(binary))
    return buf.getvalue()


def oci_archive(binary: bytes, name: str = PAUSE_IMAGE) -> bytes:
    """An OCI image layout, as one tar, holding one image with `/pause` as its entrypoint."""
    layer = _layer(binary)
    layer_gz = gzip.compress(layer, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [oci.digest(layer)]},
        }
    ).encode()
    manifest = oci.manifest(config, [(oci.LAYER_GZIP_TYPE, oci.digest(layer_gz), len(layer_gz))])
    names = {oci.NAME_ANNOTATION: name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
    files = {"oci-layout": oci.LAYOUT, "index.json": oci.index(manifest, names)}
    return oci.tar_of(
        files | {oci.blob_path(oci.digest(b)): b for b in (config, manifest, layer_gz)}
    )


def ensure_archive(cache: Path) -> Path:
    """The pause image archive, compiled and packed once per source digest."""
    path = cache / f"pause-{hashlib.sha256(PAUSE_C.encode()).hexdigest()[:12]}.tar"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src, out = Path(tmp) / "pause.c", Path(tmp) / "pause"
        src.write_text(PAUSE_C)
        res = subprocess.run(
            ["gcc", "-static", "-Os", "-s", "-o", str(out), str(src)],
            capture_output=True, text=True,
        )  # fmt: skip
        if res.returncode != 0:
            raise RuntimeError(f"building the pause binary failed:\n{res.stderr[-2000:]}")
        staged = Path(tmp) / "pause.tar"
        staged.write_bytes(oci_archive(out.read_bytes()))
        os.replace(staged, path)
    return path
