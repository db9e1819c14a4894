"""One home per thing: reason codes are spelled only in schemas/reasons.py, no module imports another
module's private names, and what tests share lives in tests/support/ (no module imports a test_* module).
Parsed with `ast`, nothing is imported or run."""
from __future__ import annotations

import ast
from pathlib import Path

from schemas.reasons import REASON_CODES

REPO = Path(__file__).resolve().parents[1]
# The packaged product (pyproject's packages) outside schemas/. Tests keep the strings: they assert the stable
# strings a user filters on, which a test importing the constant would not (it passes when the constant
# changes). benchmarks/ and scripts/ only print or count (their "timeout" is mutmut's status, not a code).
PRODUCT = ("transforms", "pipelines")
# The project's own top-level packages: a private name of anything else (vLLM, Beam) is not ours to rename.
OURS = ("transforms", "pipelines", "schemas", "tests", "benchmarks", "scripts")
# Strings equal to a reason code that are another vocabulary's word: (module, string) -> what it is. Each must
# still be there (test_each_homonym_is_still_there), so the list cannot outlive its reason.
HOMONYMS = {
    ("transforms/hints/ocr.py", "timeout"): "OcrResult.status, the Tesseract call's own outcome; a page whose OCR "
                                            "timed out gets the flag ocr_timeout, never this reason code",
}


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (n for n in ast.walk(tree) if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef
                                                        | ast.AsyncFunctionDef))
    return {id(n.body[0].value) for n in nodes if n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}


def reason_literals(source: str) -> list[tuple[int, str]]:
    """(line, code) of every string constant of `source` equal to a reason code: passed, returned, compared,
    assigned, a default. Only exact codes count (no snake_case guessing), and not docstrings or the literal
    text of an f-string, which are prose."""
    tree = ast.parse(source)
    prose = _docstrings(tree) | {id(part) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for part in n.values}
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and n.value in REASON_CODES and id(n) not in prose]
    return [(n.lineno, n.value) for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def test_reason_codes_are_spelled_only_in_schemas() -> None:
    found = [f"{path.relative_to(REPO)}:{line}: {code!r}" for path in _modules(*PRODUCT)
             for line, code in reason_literals(path.read_text(encoding="utf-8"))
             if (str(path.relative_to(REPO)), code) not in HOMONYMS]
    assert not found, ("reason codes spelled outside schemas/ (use the names of schemas/reasons.py):\n"
                       + "\n".join(found))


def test_each_homonym_is_still_there() -> None:
    for (module, code), why in HOMONYMS.items():
        assert code in {c for _, c in reason_literals((REPO / module).read_text(encoding="utf-8"))}, (module, why)


def test_reason_literals_sees_codes_where_they_are_used_and_not_in_prose() -> None:
    source = ('"""A docstring that says timeout."""\n'
              'X, Y = "timeout", "okay"\n'
              'def f(a=\'empty\'):\n    """engine_error"""\n    g("engine_error", reason_code="truncated")\n'
              '    if a == "unreadable":\n        return f"timeout{a}"\n    return a or "extraction_failed"\n')
    assert reason_literals(source) == [(2, "timeout"), (3, "empty"), (5, "engine_error"), (5, "truncated"),
                                       (6, "unreadable"), (8, "extraction_failed")]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, me: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = me.split(".") if is_package else me.split(".")[:-1]
    return ".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])])


def private_imports(source: str, me: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, what) for each `from <our module> import _name` of another module, relative ones included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(node, me, is_package)
            if base.split(".")[0] in OURS and base != me:
                found += [(node.lineno, f"from {base} import {a.name}") for a in node.names if _private(a.name)]
    return found


def private_attributes(source: str, modules: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each `mod._name` where `mod` is bound by an import to one of `modules` (ours)."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {(a.asname or a.name.split(".")[0]): (a.name if a.asname else a.name.split(".")[0])
                      for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            bound |= {(a.asname or a.name): f"{node.module}.{a.name}" for a in node.names}
    return [(n.lineno, ast.unparse(n)) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and _private(n.attr) and isinstance(n.value, ast.Name)
            and bound.get(n.value.id) in modules]


def test_no_module_imports_another_modules_private_names() -> None:
    """Product code and tests alike: a name another module needs is public (or lives where it is needed).
    Product code may not reach a module's privates by attribute either. Tests may (`monkeypatch.setattr(mod,
    "_x", ...)`, `mod._x` to wrap or count what they patch): a fault injected into one step of a module is a
    test's business, and the module keeps the name private to every other caller."""
    paths = _modules(*OURS)
    modules = {_module_name(p) for p in paths}
    found = []
    for path in paths:
        source, me = path.read_text(encoding="utf-8"), _module_name(path)
        hits = private_imports(source, me, path.name == "__init__.py")
        if not me.startswith("tests."):
            hits += private_attributes(source, modules - {me})
        found += [f"{path.relative_to(REPO)}:{line}: {what}" for line, what in hits]
    assert not found, "private names used across modules:\n" + "\n".join(sorted(found))


def test_private_name_checks_see_what_they_are_for() -> None:
    source = ("from transforms.child_process import _wait_s, ChildWorker\nfrom . import _sibling\n"
              "from .files import _root\nfrom vllm import _custom_ops\nfrom os import _exit\n"
              "import pipelines.config.options as options\nfrom transforms import child_process\n"
              "options._bool(1); child_process.__name__; Options._add_argparse_args; self._x\n")
    me = "transforms.store.compaction"
    assert private_imports(source, me) == [(1, "from transforms.child_process import _wait_s"),
                                           (2, "from transforms.store import _sibling"),
                                           (3, "from transforms.store.files import _root")]
    assert private_imports("from transforms.store.compaction import _x\n", me) == []  # itself
    assert private_attributes(source, {"pipelines.config.options", "transforms.child_process"}) == [
        (8, "options._bool")]


def imports_of_test_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) for each import of a `test_*` module (tests.x.test_y, or test_y from tests.x)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.rpartition(".")[2].startswith("test_")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
            base = node.module or ""
            if base.rpartition(".")[2].startswith("test_"):
                found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name.startswith("test_")]
    return found


def test_no_module_imports_a_test_module() -> None:
    """What several test files share lives in tests/support/; a test file is only run, never imported (an
    import runs its module-level code twice under two names, and hides a helper among tests)."""
    found = [f"{path.relative_to(REPO)}:{line}: {module}" for path in _modules(*OURS)
             for line, module in imports_of_test_modules(path.read_text(encoding="utf-8"))]
    assert not found, "imports of test modules (move what they share to tests/support/):\n" + "\n".join(found)


def test_test_imports_sees_both_spellings() -> None:
    source = ("from tests.transforms.extract.test_feed import ENGINE\nfrom tests.pipelines import test_s3, raw\n"
              "import tests.pipelines.test_waves as w\nfrom tests.support.feed_setup import config\n"
              "from tests import docmaker\n")
    assert imports_of_test_modules(source) == [
        (1, "tests.transforms.extract.test_feed"), (2, "tests.pipelines.test_s3"), (3, "tests.pipelines.test_waves")]
