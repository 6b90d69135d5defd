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

import io
import json
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from . import oci


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
        return oci.manifest(self.config, [(oci.LAYER_TYPE, x.digest, x.size) for x in self.layers])

    def index(self) -> bytes:
        """The tar's index: the one manifest, named as the image."""
        return oci.index(self.manifest(), {oci.NAME_ANNOTATION: self.name})


def parse_archive(read: Callable[[str], bytes], sizes: dict[str, int]) -> ArchiveImage:
    """The image of a docker-archive whose files ``read`` returns (by name; ``sizes``:
    every member's). ValueError when it is not one named image with a diff_id a layer."""
    entries = json.loads(read("manifest.json"))
    if not isinstance(entries, list) or len(entries) != 1:
        raise ValueError("a docker-archive of exactly one image expected")
    entry = entries[0]
    tags, members = entry.get("RepoTags") or [], entry.get("Layers") or []
    config = read(entry["Config"])
    diff_ids = json.loads(config).get("rootfs", {}).get("diff_ids", [])
    if len(tags) != 1 or len(diff_ids) != len(members):
        raise ValueError(f"one tag and a diff_id per layer expected, got {tags}, "
                         f"{len(diff_ids)} diff_ids for {len(members)} layers")  # fmt: skip
    layers = tuple(Layer(m, d, sizes[m]) for m, d in zip(members, diff_ids, strict=True))
    return ArchiveImage(tags[0], config, layers)


def read_archive(archive: tarfile.TarFile) -> ArchiveImage:
    members = {m.name: m for m in archive.getmembers()}  # headers only: seeks past the data

    def read(name: str) -> bytes:
        file = archive.extractfile(members[name])
        if file is None:
            raise ValueError(f"{name} is not a file in the archive")
        return file.read()

    return parse_archive(read, {name: m.size for name, m in members.items()})


def parse_content_list(text: str) -> set[str]:
    """`ctr content ls -q`: one digest a line."""
    return {line.strip() for line in text.splitlines() if line.strip().startswith("sha256:")}


def layers_to_send(image: ArchiveImage, stored: set[str]) -> list[Layer]:
    return [layer for layer in image.layers if layer.digest not in stored]


def write_thin_archive(out: IO[bytes], image: ArchiveImage, archive: tarfile.TarFile,
                       layers: Iterable[Layer]) -> None:  # fmt: skip
    """An OCI layout tar of ``image`` with ``layers``' blobs (read from ``archive``),
    streamed to ``out``."""
    small = {"oci-layout": oci.LAYOUT, "index.json": image.index()}
    small |= {oci.blob_path(oci.digest(blob)): blob for blob in (image.manifest(), image.config)}
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for name, data in small.items():
            oci.add_file(tar, name, len(data), io.BytesIO(data))
        for layer in layers:
            oci.add_file(tar, oci.blob_path(layer.digest), layer.size,
                         archive.extractfile(layer.member))  # fmt: skip


def import_archive(ctr: list[str], path: Path) -> None:
    """Import the docker-archive at ``path`` with ``ctr`` (its argv up to the subcommand),
    sending only the layers containerd lacks."""
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
