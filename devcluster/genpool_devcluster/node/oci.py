"""OCI image layout pieces, as the node's image imports write them (pure): digests, blob
paths, the manifest and the index naming one image, and tars of in-memory files."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable, Mapping
from typing import IO, Any

MEDIA = "application/vnd.oci.image"
MANIFEST_TYPE = f"{MEDIA}.manifest.v1+json"
CONFIG_TYPE = f"{MEDIA}.config.v1+json"
LAYER_TYPE = f"{MEDIA}.layer.v1.tar"  # uncompressed
LAYER_GZIP_TYPE = f"{MEDIA}.layer.v1.tar+gzip"
LAYOUT = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()  # the `oci-layout` file
# containerd names an imported image by this annotation (no --base-name needed).
NAME_ANNOTATION = "io.containerd.image.name"


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_path(of_digest: str) -> str:
    """Where a blob lives in a layout: ``blobs/sha256/<hex>``."""
    return "blobs/" + of_digest.replace(":", "/", 1)


def manifest(config: bytes, layers: Iterable[tuple[str, str, int]]) -> bytes:
    """An image manifest of ``config`` and ``layers`` (media type, digest, size each)."""
    blob = {"mediaType": CONFIG_TYPE, "digest": digest(config), "size": len(config)}
    listed = [{"mediaType": t, "digest": d, "size": n} for t, d, n in layers]
    body = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": blob, "layers": listed}
    return json.dumps(body).encode()


def index(of_manifest: bytes, annotations: Mapping[str, str]) -> bytes:
    """A layout's index.json: the one manifest, with ``annotations`` (its name)."""
    desc: dict[str, Any] = {"mediaType": MANIFEST_TYPE, "digest": digest(of_manifest),
                            "size": len(of_manifest), "annotations": dict(annotations)}  # fmt: skip
    return json.dumps({"schemaVersion": 2, "manifests": [desc]}).encode()


def add_file(tar: tarfile.TarFile, name: str, size: int, data: IO[bytes] | None) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    tar.addfile(info, data)


def tar_of(files: Mapping[str, bytes]) -> bytes:
    """A tar of ``files`` (name -> bytes), in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            add_file(tar, name, len(data), io.BytesIO(data))
    return buf.getvalue()
