"""The thin import's pure half (genpool_devcluster.node.image_import): a docker-archive
read as an image, the OCI manifest and index made from it, which layers go to containerd,
and the tar they go in. The import itself runs on a real containerd in the node tier
(tests/node) and is timed in docs/devcluster.md#images."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from genpool_devcluster.node import image_import, oci

NAME = "docker.io/genpool/worker:0.1.0"


def _docker_archive(layers: list[bytes], tags: tuple[str, ...] = (NAME,)) -> tarfile.TarFile:
    """A docker-archive as buildah writes one: layer tars named by their digests, the
    config (with the diff_ids), manifest.json."""
    config = json.dumps({"os": "linux", "rootfs": {"type": "layers",
                         "diff_ids": [oci.digest(x) for x in layers]}}).encode()  # fmt: skip
    files = {f"{oci.digest(x)[7:]}.tar": x for x in layers} | {"c.json": config}
    manifest = [
        {
            "Config": "c.json",
            "RepoTags": list(tags),
            "Layers": [f"{oci.digest(x)[7:]}.tar" for x in layers],
        }
    ]
    files["manifest.json"] = json.dumps(manifest).encode()
    out = io.BytesIO(oci.tar_of(files))
    return tarfile.open(fileobj=out)


def test_an_archive_is_read_as_its_image_with_layers_by_diff_id() -> None:
    image = image_import.read_archive(_docker_archive([b"torch", b"code"]))
    assert image.name == NAME
    assert [(x.digest, x.size) for x in image.layers] == [
        (oci.digest(b"torch"), 5),
        (oci.digest(b"code"), 4),
    ]
    manifest = json.loads(image.manifest())
    assert manifest["config"]["digest"] == oci.digest(image.config)
    assert [x["digest"] for x in manifest["layers"]] == [oci.digest(b"torch"), oci.digest(b"code")]
    assert {x["mediaType"] for x in manifest["layers"]} == {oci.LAYER_TYPE}  # uncompressed
    (desc,) = json.loads(image.index())["manifests"]
    assert desc["digest"] == oci.digest(image.manifest())
    assert desc["annotations"] == {oci.NAME_ANNOTATION: NAME}


@pytest.mark.parametrize("tags", [(), (NAME, "docker.io/genpool/worker:other")])
def test_an_archive_without_exactly_one_name_is_refused(tags: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="one tag"):
        image_import.read_archive(_docker_archive([b"x"], tags))


def test_only_the_layers_containerd_lacks_are_sent() -> None:
    image = image_import.read_archive(_docker_archive([b"base", b"torch", b"code v2"]))
    stored = {oci.digest(b"base"), oci.digest(b"torch"), oci.digest(b"code v1")}
    assert [x.digest for x in image_import.layers_to_send(image, stored)] == [
        oci.digest(b"code v2")
    ]
    assert len(image_import.layers_to_send(image, set())) == 3


def test_the_thin_archive_is_an_oci_layout_of_the_image_with_the_layers_sent() -> None:
    archive = _docker_archive([b"torch", b"code"])
    image = image_import.read_archive(archive)
    out = io.BytesIO()
    image_import.write_thin_archive(out, image, archive, image.layers[1:])
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert json.loads(blobs.pop("oci-layout")) == {"imageLayoutVersion": "1.0.0"}
    assert blobs.pop("index.json") == image.index()
    # Every blob under its digest: the manifest, the config and the one layer sent.
    assert {name: oci.digest(data) for name, data in blobs.items()} == {
        "blobs/" + oci.digest(data).replace(":", "/"): oci.digest(data)
        for data in (image.manifest(), image.config, b"code")
    }


def test_the_content_list_is_read_line_by_line() -> None:
    text = "sha256:aa\n\nsha256:bb  \nnot a digest\n"
    assert image_import.parse_content_list(text) == {"sha256:aa", "sha256:bb"}
