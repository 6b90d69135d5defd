"""The image builder's pure half (genpool_devcluster.images): the mirror read from APT's
sources, the COPY sources and the content key, and the buildah/debootstrap command lines.
Nothing here runs buildah; building the images is measured in docs/devcluster.md#images."""

from __future__ import annotations

from pathlib import Path

import pytest

from genpool_devcluster import images

REPO = Path(__file__).resolve().parents[3]

DEB822 = """\
Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""

ONE_LINE = """\
# the security archive first, so picking the first deb line would be wrong
deb http://mirror.example/debian-security bookworm-security main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example/debian bookworm main
"""


def test_mirror_from_a_deb822_sources_file() -> None:
    assert images.parse_mirror(DEB822) == "http://mirror.example/debian"


def test_mirror_from_a_one_line_sources_list() -> None:
    assert images.parse_mirror(ONE_LINE) == "http://mirror.example/debian"


def test_no_mirror_for_the_suite() -> None:
    assert images.parse_mirror(DEB822.replace("bookworm ", "trixie ")) is None
    assert images.parse_mirror("deb http://mirror.example/debian trixie main\n") is None
    assert images.parse_mirror("") is None


def test_deb822_skips_deb_src_stanzas() -> None:
    text = DEB822.replace("Types: deb\n#", "Types: deb-src\n#", 1)
    assert images.parse_mirror(text) is None


def test_copy_sources_of_the_shipped_dockerfiles() -> None:
    """Every COPY from the build context, not the COPY --from=stage ones."""
    for kind, package in (
        ("worker", "worker/genpool_worker"),
        ("operator", "operator/genpool_operator"),
    ):
        text = (REPO / kind / "Dockerfile").read_text()
        assert images.copy_sources(text) == ["pyproject.toml", "core/genpool_core", package]


def test_copy_sources_joins_continuations_and_skips_comments_and_flags() -> None:
    text = (
        "FROM x AS a\n# COPY commented/out /x\n"
        "COPY --chown=1:1 one two \\\n   /dest/\n"
        "COPY --from=a /opt /opt\nRUN echo COPY not/this it's /x\n"
    )
    assert images.copy_sources(text) == ["one", "two"]


def _tree(root: Path) -> None:
    (root / "core/genpool_core/__pycache__").mkdir(parents=True)
    (root / "core/genpool_core/a.py").write_text("A = 1\n")
    (root / "core/genpool_core/__pycache__/a.cpython-311.pyc").write_bytes(b"\x00")
    (root / "pyproject.toml").write_text("[project]\n")
    (root / "unrelated.txt").write_text("not copied\n")


DOCKERFILE = "FROM b\nCOPY pyproject.toml ./\nCOPY core/genpool_core core/genpool_core\n"


def _key(
    root: Path, dockerfile: str = DOCKERFILE, base: str = "sha256:b", tag: str = "0.1.0"
) -> str:
    files = images.copied_files(root, images.copy_sources(dockerfile))
    return images.content_key(dockerfile, files, base, tag)


def test_content_key_follows_the_copied_files(tmp_path: Path) -> None:
    _tree(tmp_path)
    key = _key(tmp_path)
    assert _key(tmp_path) == key  # stable
    (tmp_path / "core/genpool_core/a.py").write_text("A = 2\n")
    changed = _key(tmp_path)
    assert changed != key
    (tmp_path / "core/genpool_core/b.py").write_text("")  # a new file counts too
    assert _key(tmp_path) != changed


def test_content_key_ignores_bytecode_and_files_not_copied(tmp_path: Path) -> None:
    _tree(tmp_path)
    key = _key(tmp_path)
    (tmp_path / "core/genpool_core/__pycache__/a.cpython-311.pyc").write_bytes(b"\x01")
    (tmp_path / "core/genpool_core/__pycache__/b.cpython-311.pyc").write_bytes(b"\x02")
    (tmp_path / "core/genpool_core/stray.pyc").write_bytes(b"\x03")
    (tmp_path / "unrelated.txt").write_text("changed\n")
    assert _key(tmp_path) == key


def test_content_key_follows_the_dockerfile_the_base_and_the_tag(tmp_path: Path) -> None:
    _tree(tmp_path)
    key = _key(tmp_path)
    assert _key(tmp_path, dockerfile=DOCKERFILE + "USER 10001\n") != key
    assert _key(tmp_path, base="sha256:other") != key
    assert _key(tmp_path, tag="0.2.0") != key


def test_content_key_separates_path_from_bytes() -> None:
    """("ab", b"c") and ("a", b"bc") are different trees: lengths are hashed too."""
    one = images.content_key("", [("ab", b"c")], "", "")
    two = images.content_key("", [("a", b"bc")], "", "")
    assert one != two


@pytest.mark.parametrize(
    ("rel", "copied"),
    [
        ("core/genpool_core/a.py", True),
        ("core/genpool_core/__pycache__/a.cpython-311.pyc", False),
        ("core/genpool_core/x.pyc", False),
        ("core/genpool_core/py.typed", True),
    ],
)
def test_is_copied(rel: str, copied: bool) -> None:
    assert images.is_copied(rel) is copied


def test_every_buildah_call_uses_the_private_store() -> None:
    argv = images.buildah_argv(Path("/c/images"), "images")
    assert argv == [
        "buildah", "--root", "/c/images/storage", "--runroot", "/c/images/run",
        "--storage-driver", images.STORAGE_DRIVER, "images",
    ]  # fmt: skip


def test_bud_argv() -> None:
    argv = images.bud_argv(
        Path("/c"), "worker", Path("/repo"), "0.1.0", "localhost/genpool/base:x", Path("/ca.crt")
    )
    assert argv[:8] == images.buildah_argv(Path("/c"), "bud")
    args = argv[8:]
    assert {"--layers", "--force-rm", "--pull=never", "--network=host"} <= set(args)
    assert args[args.index("--build-arg") + 1] == "BASE_IMAGE=localhost/genpool/base:x"
    assert args[args.index("--secret") + 1] == "id=pip_cert,src=/ca.crt"
    assert args[args.index("-f") + 1] == "/repo/worker/Dockerfile"
    assert args[args.index("-t") + 1] == "docker.io/genpool/worker:0.1.0"
    assert args[-1] == "/repo"  # the build context: the repository root
    no_ca = images.bud_argv(Path("/c"), "operator", Path("/repo"), "0.1.0", "b", None)
    assert "--secret" not in no_ca


def test_push_argv_names_the_image_inside_the_archive() -> None:
    argv = images.push_argv(Path("/c"), "docker.io/genpool/operator:0.1.0", Path("/c/o.tar"))
    assert argv[-2:] == [
        "docker.io/genpool/operator:0.1.0",
        "docker-archive:/c/o.tar:docker.io/genpool/operator:0.1.0",
    ]


def test_debootstrap_argv() -> None:
    argv = images.debootstrap_argv(Path("/r"), "http://mirror.example/debian")
    assert argv == [
        "debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
        "bookworm", "/r", "http://mirror.example/debian",
    ]  # fmt: skip


def test_base_name_follows_the_package_list() -> None:
    name = images.base_name()
    assert name.startswith("localhost/genpool/base:bookworm-")
    assert images.base_name(reversed(images.BASE_PACKAGES)) == name  # order does not matter
    assert images.base_name([*images.BASE_PACKAGES, "curl"]) != name


def test_the_tag_is_the_charts_app_version_and_the_operators_default() -> None:
    tag = images.parse_app_version((REPO / "charts/genpool/Chart.yaml").read_text())
    handlers = (REPO / "operator/genpool_operator/handlers.py").read_text()
    assert f'DEFAULT_WORKER_IMAGE = "genpool/worker:{tag}"' in handlers
    # containerd's name for "genpool/worker:<tag>" (docker.io is the implied registry).
    assert images.image_name("worker", tag) == f"docker.io/genpool/worker:{tag}"
    assert images.parse_app_version("version: 1.0.0\nappVersion: '2.0.1'\n") == "2.0.1"
    with pytest.raises(ValueError):
        images.parse_app_version("version: 1.0.0\n")


def test_ca_candidates_prefer_the_hosts_pip_settings() -> None:
    env = {"PIP_CERT": "/p.crt", "SSL_CERT_FILE": "", "REQUESTS_CA_BUNDLE": "/r.crt"}
    assert images.ca_candidates(env) == [Path("/p.crt"), Path("/r.crt"), images.CA_DEFAULT]
    assert images.ca_candidates({}) == [images.CA_DEFAULT]
