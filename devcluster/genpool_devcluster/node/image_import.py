"""Import an image archive into the node's containerd, sending only the layers it lacks.

The images are docker-archives (``images.ensure_image``): a config, uncompressed layer
tars and a manifest.json naming them. Handed to `ctr images import` as they are, containerd
reads and hashes all 6 GB of the worker's and gzips every layer it has not seen (84 s to
re-import an archive whose layers it already held; 94-150 s into an empty store). Instead
the archive is turned, as a stream, into an OCI layout tar: an index naming the image, an
OCI manifest whose layers are the config's ``diff_ids`` (by the image spec, the digests of
the uncompressed layer tars), the config, and only the layers the content store lacks.
ctr stores what the tar holds, then makes the image from the index and unpacks its layers
from the store, so a layer it already holds need not be sent (checked on containerd 1.6:
docs/devcluster.md#images). After a code edit that is the worker's top layer, a few MB.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'
# containerd names the imported image by this annotation (no --base-name needed).
NAME_ANNOTATION = "io.containerd.image.name"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"  # uncompressed


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Layer:
    member: str  # its file in the archive
    digest: str  # of its uncompressed tar: the config's diff_id
    size: int


@dataclass(frozen=True)
class ArchiveImage:
    """What a docker-archive holds for its one image."""

    name: str
    config: bytes
    layers: tuple[Layer, ...]

    def manifest(self) -> bytes:
        """The image's OCI manifest: the config and the layers, uncompressed."""
        blob = {"mediaType": CONFIG_TYPE, "digest": _digest(self.config), "size": len(self.config)}
        layers = [
            {"mediaType": LAYER_TYPE, "digest": x.digest, "size": x.size} for x in self.layers
        ]
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": blob,
            "layers": layers,
        }
        return json.dumps(manifest).encode()

    def index(self) -> bytes:
        """The tar's index: the one manifest, named as the image."""
        manifest = self.manifest()
        desc = {"mediaType": MANIFEST_TYPE, "digest": _digest(manifest), "size": len(manifest),
                "annotations": {NAME_ANNOTATION: self.name}}  # fmt: skip
        return json.dumps({"schemaVersion": 2, "manifests": [desc]}).encode()


def parse_archive(
    manifest_json: bytes, read: dict[str, bytes], sizes: dict[str, int]
) -> ArchiveImage:
    """The image of a docker-archive from its manifest.json, its config (``read``: file
    name -> bytes) and its members' sizes. ValueError when it is not one named image of
    uncompressed layers."""
    entries = json.loads(manifest_json)
    if not isinstance(entries, list) or len(entries) != 1:
        raise ValueError("a docker-archive of exactly one image expected")
    entry = entries[0]
    tags, members = entry.get("RepoTags") or [], entry.get("Layers") or []
    config = read[entry["Config"]]
    diff_ids = json.loads(config).get("rootfs", {}).get("diff_ids", [])
    if len(tags) != 1 or len(diff_ids) != len(members):
        raise ValueError(f"one tag and a diff_id per layer expected, got {tags}, "
                         f"{len(diff_ids)} diff_ids for {len(members)} layers")  # fmt: skip
    layers = tuple(Layer(m, d, sizes[m]) for m, d in zip(members, diff_ids, strict=True))
    return ArchiveImage(tags[0], config, layers)


def parse_content_list(text: str) -> set[str]:
    """`ctr content ls -q`: one digest a line."""
    return {line.strip() for line in text.splitlines() if line.strip().startswith("sha256:")}


def layers_to_send(image: ArchiveImage, stored: set[str]) -> list[Layer]:
    return [layer for layer in image.layers if layer.digest not in stored]


def write_thin_archive(out: IO[bytes], image: ArchiveImage, archive: tarfile.TarFile,
                       layers: Iterable[Layer]) -> None:  # fmt: skip
    """An OCI layout tar of ``image`` with ``layers``' blobs (read from ``archive``),
    streamed to ``out``."""
    manifest = image.manifest()
    small = [("oci-layout", OCI_LAYOUT), ("index.json", image.index())]
    small += [(_blob_path(_digest(blob)), blob) for blob in (manifest, image.config)]
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for name, data in small:
            tar.addfile(_info(name, len(data)), io.BytesIO(data))
        for layer in layers:
            tar.addfile(
                _info(_blob_path(layer.digest), layer.size), archive.extractfile(layer.member)
            )


def _blob_path(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/", 1)


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def read_archive(archive: tarfile.TarFile) -> ArchiveImage:
    members = {m.name: m for m in archive.getmembers()}  # headers only: seeks past the data
    sizes = {name: m.size for name, m in members.items()}

    def read(name: str) -> bytes:
        file = archive.extractfile(members[name])
        if file is None:
            raise ValueError(f"{name} is not a file in the archive")
        return file.read()

    manifest_json = read("manifest.json")
    entries = json.loads(manifest_json)
    config_name = entries[0]["Config"] if isinstance(entries, list) and entries else ""
    return parse_archive(manifest_json, {config_name: read(config_name)}, sizes)


def import_archive(ctr: list[str], path: Path) -> tuple[int, int]:
    """Import the docker-archive at ``path`` with ``ctr`` (its argv up to the subcommand),
    sending only the layers containerd lacks; returns (layers sent, bytes sent)."""
    listed = subprocess.run([*ctr, "content", "ls", "-q"], capture_output=True, text=True)
    if listed.returncode != 0:
        raise RuntimeError(f"ctr content ls: {listed.stderr.strip()[-2000:]}")
    with tarfile.open(path) as archive, tempfile.TemporaryFile() as said:
        image = read_archive(archive)
        layers = layers_to_send(image, parse_content_list(listed.stdout))
        # ctr's output to a file: a pipe it filled while we write could block both.
        proc = subprocess.Popen([*ctr, "images", "import", "-"], stdin=subprocess.PIPE,
                                stdout=said, stderr=said)  # fmt: skip
        assert proc.stdin is not None
        try:
            write_thin_archive(proc.stdin, image, archive, layers)
        except BrokenPipeError:
            pass  # ctr stopped reading: its exit status and output say why
        finally:
            proc.stdin.close()
        if proc.wait() != 0:
            said.seek(0)
            text = said.read().decode(errors="replace")[-2000:].strip()
            raise RuntimeError(f"ctr images import {path.name} ({image.name}): {text}")
    return len(layers), sum(layer.size for layer in layers)
