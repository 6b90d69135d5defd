"""The import-linter contracts (pyproject.toml) against docs/architecture.md's contract table.

The purity contracts go by package: each covers every module of its package and names
the package's few I/O modules, once in forbidden_modules (the rest may not import them)
and once in ignore_imports as "module -> **" (what an I/O module imports is not checked).
These tests keep that shape, keep every module a contract names a real file, and keep
the table's exceptions column the same as the contracts' exceptions.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TESTS

REPO = TESTS.parent
DOC = REPO / "docs" / "architecture.md"
SECTION = "## Layers and purity contracts"
EXCEPTIONS_COLUMN = "exceptions: the package's I/O modules"
# The packages whose purity contract covers the whole package.
BY_PACKAGE = ("genpool_core", "genpool_sim", "genpool_operator", "genpool_worker")
NO_EXCEPTIONS = ("genpool_core",)

Contract = dict[str, Any]


@cache
def importlinter() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]  # type: ignore[no-any-return]


def contracts() -> list[Contract]:
    return list(importlinter()["contracts"])


def key(contract: Contract) -> str:
    """The name up to its colon: the table's first column."""
    return str(contract["name"]).partition(":")[0].strip()


def root(module: str) -> str:
    return module.partition(".")[0]


def is_internal(module: str) -> bool:
    return root(module) in importlinter()["root_packages"]


def base(expression: str) -> str:
    """A module expression without its trailing wildcard: genpool_worker.model.** -> ..model."""
    return expression.removesuffix(".**").removesuffix(".*")


def package_of(contract: Contract) -> str | None:
    """The package a by-package contract covers (source_modules is pkg and pkg.**), else None."""
    sources = set(contract.get("source_modules", ()))
    packages = {root(m) for m in sources}
    if contract["type"] != "forbidden" or len(packages) != 1:
        return None
    (package,) = packages
    return package if sources == {package, f"{package}.**"} else None


def purity_contracts() -> dict[str, Contract]:
    found: dict[str, Contract] = {}
    for contract in contracts():
        package = package_of(contract)
        if package is not None:
            assert package not in found, f"two by-package contracts for {package}"
            found[package] = contract
    return found


def ignored(contract: Contract) -> list[tuple[str, str]]:
    pairs = []
    for expression in contract.get("ignore_imports", ()):
        importer, arrow, imported = str(expression).partition("->")
        assert arrow, f"{contract['name']}: not an import expression: {expression!r}"
        pairs.append((importer.strip(), imported.strip()))
    return pairs


def exceptions(contract: Contract) -> set[str]:
    """The I/O modules a contract exempts: the importers of its ignore_imports."""
    return {base(importer) for importer, _ in ignored(contract)}


def relative(module: str) -> str:
    return module.partition(".")[2]


# --- pyproject.toml -------------------------------------------------------------------


def test_each_pure_package_has_one_contract_over_the_whole_package() -> None:
    found = purity_contracts()
    assert set(found) == set(BY_PACKAGE)
    for contract in found.values():
        # pkg and pkg.** one by one: each module is a source, so a pure module that imports
        # one of the package's I/O modules is not skipped as "the same package".
        assert contract.get("as_packages") is False, contract["name"]
    for package in NO_EXCEPTIONS:
        assert exceptions(found[package]) == set(), f"{package} is pure without exception"


def test_no_contract_allows_indirect_imports() -> None:
    allowing = [c["name"] for c in contracts() if c.get("allow_indirect_imports", False)]
    assert allowing == []


@pytest.mark.parametrize("package", BY_PACKAGE)
def test_the_io_modules_are_exempt_and_forbidden_to_the_rest(package: str) -> None:
    contract = purity_contracts()[package]
    for importer, imported in ignored(contract):
        assert root(importer) == package, f"{importer}: another package's module"
        assert imported == "**", f"{importer} -> {imported}: exempt a module as a whole"
    forbidden = contract["forbidden_modules"]
    internal = {base(m) for m in forbidden if is_internal(m)}
    assert internal == exceptions(contract)
    assert all(root(m) == package for m in internal)
    # a subpackage that is an exception is exempt and forbidden with its descendants too
    for module in exceptions(contract):
        if module_path(module).name == "__init__.py":
            assert f"{module}.**" in forbidden, module
            assert f"{module} -> **" in contract["ignore_imports"], module
            assert f"{module}.** -> **" in contract["ignore_imports"], module


def test_the_pure_packages_share_the_cores_list() -> None:
    """The simulator and the operator forbid what the core does; the simulator allows random."""
    found = purity_contracts()

    def external(package: str) -> set[str]:
        return {m for m in found[package]["forbidden_modules"] if not is_internal(m)}

    core = external("genpool_core")
    assert {"torch", "time", "random", "os", "logging", "kubernetes"} <= core
    assert external("genpool_operator") == core
    assert external("genpool_sim") == core - {"random"}


def package_dir(package: str) -> Path:
    found = [p.parent for p in REPO.glob(f"*/{package}/__init__.py")]
    assert len(found) == 1, f"{package}: {found}"
    return found[0]


def module_path(module: str) -> Path:
    """The file of a module or package; fails if there is none."""
    parts = module.split(".")
    path = package_dir(parts[0]).joinpath(*parts[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise AssertionError(f"{module}: no such module ({path}.py or {path}/__init__.py)")


def named_modules(contract: Contract) -> Iterator[str]:
    for layer in contract.get("layers", ()):
        for name in re.split(r"[|:]", layer):
            yield name.strip().strip("()")
    yield from contract.get("containers", ())
    yield from contract.get("source_modules", ())
    yield from contract.get("forbidden_modules", ())
    yield from contract.get("modules", ())
    for importer, imported in ignored(contract):
        yield importer
        yield imported


@pytest.mark.parametrize("contract", contracts(), ids=key)
def test_every_module_a_contract_names_exists(contract: Contract) -> None:
    for expression in named_modules(contract):
        if expression == "**":
            continue
        prefix = expression.split(".*")[0]  # before its first wildcard
        assert "*" not in prefix, expression
        if not is_internal(prefix):
            assert "." not in prefix, f"{expression}: forbid an external package as a whole"
            continue
        path = module_path(prefix)
        if prefix != expression:  # a wildcard needs a package to match in
            assert path.name == "__init__.py", f"{expression}: {prefix} is not a package"


def test_the_root_packages_exist() -> None:
    for package in importlinter()["root_packages"]:
        package_dir(package)


# --- docs/architecture.md ---------------------------------------------------------------


def doc_table(text: str) -> list[dict[str, str]]:
    """The first table after SECTION, one dict per row keyed by the header's cells."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    header, separator, *body = rows
    assert set("".join(separator)) <= set("-: "), "the header's separator row"
    for row in body:
        assert len(row) == len(header), f"a '|' inside a cell? {row}"
    return [dict(zip(header, row, strict=True)) for row in body]


def documented(text: str) -> dict[str, set[str]]:
    """The exceptions each row names: its backticked modules, relative to the package."""
    table = doc_table(text)
    names = [row["contract"] for row in table]
    assert len(names) == len(set(names)), f"a contract twice: {names}"
    return {
        row["contract"]: {m.rstrip("/") for m in re.findall(r"`([^`]+)`", row[EXCEPTIONS_COLUMN])}
        for row in table
    }


def expected() -> dict[str, set[str]]:
    keys = [key(c) for c in contracts()]
    assert len(keys) == len(set(keys)), f"contract names share a prefix: {keys}"
    return {key(c): {relative(m) for m in exceptions(c)} for c in contracts()}


def test_the_doc_table_lists_the_contracts_and_their_io_modules() -> None:
    assert documented(DOC.read_text()) == expected()


def test_the_doc_check_fails_when_the_table_drifts() -> None:
    text = DOC.read_text()
    assert documented(text.replace("`pool_health`, ", "", 1)) != expected()
    assert documented(text.replace("`datafiles`", "`datafiles`, `replica`", 1)) != expected()
    dropped = re.sub(r"^\| Worker \|.*\n", "", text, count=1, flags=re.MULTILINE)
    assert documented(dropped) != expected()
