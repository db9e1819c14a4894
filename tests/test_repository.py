"""The repository itself: it names no machine (no absolute path of a developer's or CI's machine in any
tracked file; the shared corpus is `../shared/corpus` beside the clone, or $PAGEMILL_CORPUS), cites no file
outside it, keeps its layers (nothing in transforms/ or schemas/ imports pipelines/) and its modules short."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Built from parts so that this file does not match itself.
ROOTS = ["wo" + "rk", "ho" + "me", "ro" + "ot", "Us" + "ers", "mn" + "t", "tm" + "p"]
MACHINE_PATH = re.compile("(?<![\\w.~<>-])/(" + "|".join(ROOTS) + ")/[\\w.-]+")


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / name for name in out.decode().split("\0") if name]


def test_no_machine_paths_in_tracked_files() -> None:
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary samples
        found += [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                  for m in MACHINE_PATH.finditer(text)]
    assert not found, "machine paths in the repository:\n" + "\n".join(found)


def test_the_pattern_finds_what_it_is_for() -> None:
    sample = "see " + "/wo" + "rk/main/samples/a.pdf and " + "/ho" + "me/dev/x"
    assert [m.group(0) for m in MACHINE_PATH.finditer(sample)] == ["/wo" + "rk/main", "/ho" + "me/dev"]
    assert not MACHINE_PATH.search("<checkout>/samples/a.pdf ../shared/corpus s3://bucket" + "/wo" + "rk/x")


# The layers: pipelines/ (the command line and the run) builds on transforms/ (the stages), which build on
# schemas/ (records, tables, layout). Nothing below imports from above.
LOWER_LAYERS = ("transforms", "schemas")
MAX_MODULE_LINES = 400


def imports_of(source: str) -> list[str]:
    """Every module an `import` or `from ... import` in this source names (relative ones as written)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append("." * node.level + (node.module or ""))
    return names


def _modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_transforms_and_schemas_never_import_pipelines() -> None:
    found = [f"{path.relative_to(REPO)}: {name}" for path in _modules(*LOWER_LAYERS)
             for name in imports_of(path.read_text(encoding="utf-8"))
             if name == "pipelines" or name.startswith(("pipelines.", ".."))]
    assert not found, "upward imports (transforms/ and schemas/ must not import pipelines/):\n" + "\n".join(found)


def test_imports_of_sees_every_kind_of_import() -> None:
    source = ("import os, pipelines.tables.sql as s\nfrom pipelines import cli\nfrom ..pipelines import x\n"
              "def f():\n    from pipelines.tables.sql import TABLE_KEYS\n")
    assert imports_of(source) == ["os", "pipelines.tables.sql", "pipelines", "..pipelines", "pipelines.tables.sql"]


def test_no_module_is_over_400_lines() -> None:
    modules = _modules("pipelines", "transforms", "schemas")
    assert len(modules) > 30  # the folders were found
    long = {str(p.relative_to(REPO)): n for p in modules
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"


# Comments and docs say the thing itself: they cite nothing a clone does not have (the design notes, the
# reference and seed folders beside the repository). `../shared/corpus` is a real input of the tests.
# Built from parts so that this file does not match itself.
OUTSIDE = re.compile("DES" + "IGN\\.md|\\bshared/(?!corpus\\b)[\\w.-]")


def test_nothing_cites_files_outside_the_repository() -> None:
    found = []
    for path in tracked_files():
        if path.suffix not in (".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".html") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {text[m.start():m.end() + 30]}"
                  for m in OUTSIDE.finditer(text)]
    assert not found, "citations of files that are not in the repository:\n" + "\n".join(found)


def test_the_citation_pattern_finds_what_it_is_for() -> None:
    cited = ["the graph of " + "DES" + "IGN.md", "adapted from shared" + "/reference/x.py",
             "../shared" + "/seeds/0.txt"]
    assert all(OUTSIDE.search(c) for c in cited)
    assert not OUTSIDE.search("../shared/corpus/hostile and lay shared/ beside the clone")
