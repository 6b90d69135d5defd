"""P/D behind one seam (docs/pd.md#the-connector): the worker's modules outside
``genpool_worker/pd/`` reach P/D only through the KV connector's protocols
(``kv_connector``, ``kv_edge``). Only the wiring modules, which build the process and the
app, import ``genpool_worker.pd`` (lazy and type-checking imports included; the
import-linter contract "Worker core below P/D" checks the same graph), and P/D's words
stay out of the rest of the worker's code.

The words are counted in code only (comments and docstrings are docs): in identifiers,
split at underscores, and in string literals. ``pd_references`` is the reproducible count
the budgets below hold; ``python -m tests.unit.test_pd_seam`` prints it per module.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections import Counter
from pathlib import Path

from tests.conftest import TESTS

WORKER = TESTS.parent / "worker" / "genpool_worker"
PD = "genpool_worker.pd"
# It builds the P/D parts and hands them in: the engine its connector, the app its edge
# and routes (``kv_edge.KVTransferParts``); the command line inherits P/D's flags
# (``pd.flags``: --role, --prefillers, the KV caps and secret).
WIRING = ("worker_cli.py", "worker_config.py")
# The same words with other meanings: file handles, CUDA's graph pool handle, uvicorn's
# handle_exit.
OTHER_MEANINGS = ("model/hf_weights.py", "model/decode_graphs.py", "serving.py")
# A handle's layout refused for tensor parallelism says why in the 400 (kv_layout.py).
ELSEWHERE_BUDGET = 1
# All of them but the other meanings (issue 34 took the worker's 89 to 5): a ratchet.
BUDGET = 5
WORDS = re.compile(
    r"(?i)(?<![a-z0-9])(pd|p/d|prefill[ _]legs?|kv_import|kv_export|handles?|prefillers?)"
    r"(?![a-z0-9])"
)


def worker_modules() -> list[Path]:
    """Every module of the worker outside its P/D package."""
    return [p for p in sorted(WORKER.rglob("*.py")) if "pd" not in p.relative_to(WORKER).parts[:-1]]


def name(path: Path) -> str:
    return path.relative_to(WORKER).as_posix()


def imported_modules(tree: ast.AST, module: str) -> set[str]:
    """Every module ``tree`` imports, anywhere in it (``module``: its own dotted name)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package
                package = module.rsplit(".", node.level)[0]
                base = f"{package}.{base}" if base else package
            found.update(f"{base}.{alias.name}" for alias in node.names)
            found.add(base)
    return found


def _docstring_starts(tree: ast.AST) -> set[tuple[int, int]]:
    starts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                starts.add((first.lineno, first.col_offset))
    return starts


def pd_references(path: Path) -> list[str]:
    """P/D's words in ``path``'s code: identifiers and strings, not comments or docstrings."""
    text = path.read_text()
    docstrings = _docstring_starts(ast.parse(text))
    code_kinds = {tokenize.NAME, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)}
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in code_kinds and token.start not in docstrings:
            found += [f"{token.start[0]}:{m.group(0)}" for m in WORDS.finditer(token.string)]
    return found


def counts() -> Counter[str]:
    return Counter({name(p): len(refs) for p in worker_modules() if (refs := pd_references(p))})


def test_only_the_wiring_modules_import_pd() -> None:
    importers = []
    for path in worker_modules():
        module = "genpool_worker." + name(path).removesuffix(".py").replace("/", ".")
        module = module.removesuffix(".__init__")
        imports = imported_modules(ast.parse(path.read_text()), module)
        if any(m == PD or m.startswith(PD + ".") for m in imports):
            importers.append(name(path))
    assert sorted(importers) == sorted(WIRING)


def test_pd_words_stay_in_pd_and_the_wiring() -> None:
    found = counts()
    for module in OTHER_MEANINGS:
        found.pop(module, None)
    elsewhere = {module: n for module, n in found.items() if module not in WIRING}
    assert sum(elsewhere.values()) <= ELSEWHERE_BUDGET, elsewhere
    assert sum(found.values()) <= BUDGET, found


def test_the_count_sees_code_but_not_docs(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text(
        '"""P/D: a prefill leg\'s handle (a docstring: docs)."""\n'
        "# kv_import in a comment\n"
        "def build(pd: int) -> str:\n"
        '    """handle again."""\n'
        '    return f"prefillers {pd}"  # kv_export\n'
    )
    assert [ref.partition(":")[2] for ref in pd_references(source)] == ["pd", "prefillers", "pd"]


if __name__ == "__main__":
    for module, n in sorted(counts().items()):
        print(f"{n:4d}  {module}")
    print(f"{sum(counts().values()):4d}  total outside pd/")


# Issue 34: the runner owns the cache, its sizing and the CUDA graphs (model/cache_engine.py),
# so the model is its layers; a file that grows past this is taking a job back.
MAX_MODEL_LINES = 250  # the target


def test_the_model_is_its_layers_only() -> None:
    lines = (WORKER / "model" / "llama.py").read_text().count("\n")
    assert lines < MAX_MODEL_LINES, (
        f"model/llama.py has {lines} lines (cache, sizing or graphs back?)"
    )
