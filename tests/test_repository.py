"""The repository itself: it names no machine (no absolute path of a developer's or CI's machine in any
tracked file; the shared corpus is `../shared/corpus` beside the clone, or $PAGEMILL_CORPUS), cites no file
outside it, keeps its layers (nothing in transforms/ or schemas/ imports pipelines/; the rooms of transforms/ and
of pipelines/ import downward only and in no circle) and its modules short."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

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


# The rooms of transforms/, low to high: a module imports from its own room or a lower one, never a higher one,
# and no modules import each other in a circle (lazy and type-only imports count: they are the usual way a
# circle is papered over). Each room is one folder (or a top-level module); a new one must be placed here.
TRANSFORMS_ROOMS = ("text_safety", "store", "child_sandbox", "child_process", "intake", "pages", "safety", "model",
                    "hints", "output", "document_work", "engines", "extract")


def _module_name(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Each module of `sources` (repository path -> source) -> the modules of `sources` it imports: `import` and
    `from ... import` at module level, inside functions and under `if TYPE_CHECKING:`, absolute and relative.
    `from pkg import mod` is an import of pkg.mod when that is a module, else of pkg. Top-level packages
    (transforms/__init__.py) are left out: every import runs them, so they say nothing about the order."""
    modules = {_module_name(p) for p in sources}

    def nearest(name: str) -> str:  # the module itself, or the package that holds the name
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for path, source in sources.items():
        me = _module_name(path)
        package = me.split(".") if path.endswith("__init__.py") else me.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                targets |= {nearest(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else nearest(base))
        graph[me] = {t for t in targets if "." in t and t != me}
    return {m: ts for m, ts in graph.items() if "." in m}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (a -> b -> ... -> a) through each group of modules that import each other, directly or not."""
    found: list[list[str]] = []
    seen: set[str] = set()
    for start in sorted(graph):
        if start in seen:
            continue
        # The shortest way back to `start` (breadth first), if there is one.
        back: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in back:
            nxt = []
            for m in frontier:
                for t in sorted(graph.get(m, ())):
                    if t not in back:
                        back[t] = m
                        nxt.append(t)
            frontier = nxt
        if start in back:
            path = [start]
            while back[path[-1]] != start:
                path.append(back[path[-1]])
            circle = [start, *reversed(path[1:]), start]
            seen |= set(circle)
            found.append(circle)
    return found


def upward_imports(graph: dict[str, set[str]], rooms: tuple[str, ...]) -> list[str]:
    """Edges from a room to a higher one (and modules whose room is not declared), as 'a (room) -> b (room)'."""
    def room(module: str) -> str:
        return module.split(".")[1]

    found = sorted({f"{m} ({room(m)}) is in no declared room" for m in graph if room(m) not in rooms})
    found += sorted(f"{m} ({room(m)}) -> {t} ({room(t)})" for m, ts in graph.items() for t in ts
                    if room(m) in rooms and room(t) in rooms and rooms.index(room(t)) > rooms.index(room(m)))
    return found


def _graph_of(folder: str) -> dict[str, set[str]]:
    return import_graph({str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in _modules(folder)})


# The rooms of pipelines/, low to high: the tiny test models stand alone; config/ is what every command shares
# (options, job files, storage); the tables are read by the run and the estimate; the estimate builds on the
# run's settings; bench/ scores runs on public benchmarks; cli.py dispatches to them all.
PIPELINES_ROOMS = ("tiny_models", "config", "tables", "run", "estimate", "bench", "cli")
TREES = {"transforms": (TRANSFORMS_ROOMS, 30), "pipelines": (PIPELINES_ROOMS, 20)}  # rooms, modules at least


@pytest.mark.parametrize("tree", TREES)
def test_no_import_circle(tree: str) -> None:
    graph = _graph_of(tree)
    assert len(graph) > TREES[tree][1] and any(graph.values())  # the folder and its imports were found
    found = circles(graph)
    assert not found, f"import circles in {tree}/:\n" + "\n".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("tree", TREES)
def test_rooms_import_only_their_own_or_lower_rooms(tree: str) -> None:
    rooms = TREES[tree][0]
    found = upward_imports(_graph_of(tree), rooms)
    assert not found, f"upward imports in {tree}/ (rooms low to high: " + " < ".join(rooms) + "):\n" + "\n".join(found)


def test_engines_never_import_the_extraction_stage() -> None:
    found = sorted(f"{m} -> {t}" for m, ts in _graph_of("transforms").items() for t in ts
                   if m.startswith("transforms.engines") and t.startswith("transforms.extract"))
    assert not found, "transforms/engines/ imports transforms/extract/:\n" + "\n".join(found)


def test_engines_know_no_output_format() -> None:
    """A request says what to constrain (a JSON schema, or a prompt's words and no JSON constraint), never which
    output format makes it: nothing in transforms/engines/ imports transforms/model/markdown.py."""
    found = sorted(f"{m} -> {t}" for m, ts in _graph_of("transforms").items() for t in ts
                   if m.startswith("transforms.engines") and t == "transforms.model.markdown")
    assert not found, "transforms/engines/ imports the markdown formats:\n" + "\n".join(found)


# The backends' rooms in transforms/engines/ and the rooms each may import besides the contract (base.py): the
# machine's service runs the local engine (a benchmark's: the simulated one), one per device (devices/); both vLLM
# backends and the simulated one share the vLLM helpers.
ENGINE_ROOMS = {"vllm_shared": set(), "vllm_local": {"vllm_shared"},
                "vllm_machine": {"vllm_shared", "vllm_local", "simulated", "devices"}, "devices": set(),
                "openai": set(), "openai_batch": {"openai"}, "simulated": {"vllm_shared"}}


def test_each_engine_room_imports_only_what_it_builds_on() -> None:
    graph = _graph_of("transforms")
    assert {m.split(".")[2] for m in graph if m.startswith("transforms.engines.")} >= set(ENGINE_ROOMS)
    found = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                   if (mine := m.split(".")[2:3]) and m.startswith("transforms.engines.") and mine[0] in ENGINE_ROOMS
                   and t.startswith("transforms.engines.") and (theirs := t.split(".")[2]) in ENGINE_ROOMS
                   and theirs != mine[0] and theirs not in ENGINE_ROOMS[mine[0]])
    assert not found, "an engine room imports another backend's:\n" + "\n".join(found)


def test_import_graph_sees_every_kind_of_import() -> None:
    sources = {
        "t/__init__.py": "import os\n",
        "t/a/__init__.py": "from . import x\n",  # relative, in a package: t.a.x
        "t/a/x.py": "import t.b.y as y\nfrom t.b import z\nfrom t.c import NAME\n",  # module, module, package
        "t/a/w.py": "from .x import f\nfrom ..b import y\nfrom .. import c\n",  # relative: t.a.x, t.b.y, t.c
        "t/b/__init__.py": "",
        "t/b/y.py": "def f():\n    from t.c.v import g\n",  # lazy
        "t/b/z.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from t.a.w import h\n",  # type-only
        "t/c/__init__.py": "NAME = 1\n",
        "t/c/v.py": "import json, t.b.z\nimport t\n",  # the top package is not an edge
    }
    assert import_graph(sources) == {
        "t.a": {"t.a.x"}, "t.a.x": {"t.b.y", "t.b.z", "t.c"}, "t.a.w": {"t.a.x", "t.b.y", "t.c"},
        "t.b": set(), "t.b.y": {"t.c.v"}, "t.b.z": {"t.a.w"}, "t.c": set(), "t.c.v": {"t.b.z"},
    }


def test_the_circle_and_room_checks_fail_when_they_should() -> None:
    graph = {"t.a.x": {"t.b.y"}, "t.b.y": {"t.b.z"}, "t.b.z": {"t.a.x"}, "t.c.v": {"t.a.x"}, "t.d.u": set()}
    assert circles(graph) == [["t.a.x", "t.b.y", "t.b.z", "t.a.x"]]
    assert circles({"t.a.x": {"t.b.y"}, "t.b.y": set()}) == []
    assert upward_imports(graph, ("a", "b", "c")) == ["t.d.u (d) is in no declared room", "t.a.x (a) -> t.b.y (b)"]
    assert upward_imports({"t.b.y": {"t.a.x", "t.b.z"}}, ("a", "b")) == []


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


# The tables' room (transforms/store/): one module builds the patterns and folders of the tables' part files and
# lists them; every other module asks it (run_files, tenant_files, table_files ...), so a new sink or reader
# cannot grow a second way of finding the files.
TABLE_FILE_NAMES = ("part_glob(", "table_folder(", "is_part_file(")


def test_one_module_lists_the_tables_files() -> None:
    found = sorted(f"{path.relative_to(REPO)}: {name}" for path in _modules("pipelines", "transforms", "benchmarks")
                   for name in TABLE_FILE_NAMES if name in path.read_text() and
                   path.relative_to(REPO).as_posix() != "transforms/store/files.py")
    assert not found, "the tables' part files are listed outside transforms/store/files.py:\n" + "\n".join(found)


# The engine choice (issue 37): `--engine` and its aliases are read and resolved in one place,
# pipelines/config/engine.py; everything else holds the settings value and transforms.engines.make builds the engine
# by its kind. A comparison of the flag, the alias or a kind elsewhere is a second home of the choice.
ENGINE_COMPARISON = re.compile(
    r"(\.engine(_service)?|\bengine\.kind|\bengine_kind\([^)]*\))\s*(==|!=|not\s+in\b|in\b)"
    r"|(==|!=|\bin)\s+[\w.]*(\.engine(_service)?|\bengine\.kind)\b(?!\w)")
ENGINE_CHOICE_HOMES = ("pipelines/config/", "transforms/engines/")


def test_no_engine_comparison_outside_option_parsing_and_the_engines() -> None:
    found = sorted(f"{path.relative_to(REPO)}:{n}: {line.strip()}"
                   for path in _modules("pipelines", "transforms", "benchmarks", "scripts")
                   if not path.relative_to(REPO).as_posix().startswith(ENGINE_CHOICE_HOMES)
                   for n, line in enumerate(path.read_text().splitlines(), 1) if ENGINE_COMPARISON.search(line))
    assert not found, "the engine is compared outside pipelines/config/ and transforms/engines/:\n" + "\n".join(found)


def test_the_engine_comparison_pattern_finds_what_it_is_for() -> None:
    compared = ['if o.engine == "openai":', "elif o.engine_service != 'auto':", 'if o.engine in ("vllm", "x"):',
                'if s.engine.kind == "vllm_machine":', 'uses = engine_kind(o) != "openai"',
                'if "openai" == o.engine:', "x = kind in settings.engine.kind"]
    assert all(ENGINE_COMPARISON.search(c) for c in compared)
    fine = ["engine = make(s.engine)", "for engine in engines:", "self.engine = engine", "if engine is None:",
            "o.engine_in_process == True", "ExtractPages(s.engine, s.extract)"]
    assert not any(ENGINE_COMPARISON.search(f) for f in fine)


# Only the store changes a run's files (issue 45): deleting or renaming under the output root is
# transforms/store/'s (RunTables, compaction, the listing, the manifest). Elsewhere, only files of no table, each
# named here with what it is (the hosted batch engine's spool lies under the output root: the engine's own files).
REMOVES = re.compile(r"FileSystems\.(delete|rename)\(|\b(os\.(remove|unlink|rename|replace|rmdir)"
                     r"|shutil\.(rmtree|move))\(|\.(unlink|rename|rmdir)\(")
REMOVES_ELSEWHERE = {
    "pipelines/run/run_log.py": "a command's log folder from tempfile.mkdtemp, never under the output root",
    "transforms/engines/vllm_machine/engine.py": "the machine engine's socket in its service folder (folder.py)",
    "transforms/engines/vllm_machine/stats.py": "the engine's figures in its service folder (folder.py)",
    "transforms/engines/openai_batch/lock.py": "the hosted batch engine's launcher lock in its spool (batch_folder)",
    "transforms/engines/openai_batch/files.py": "the hosted batch engine's spooled requests (batch_folder)",
}


def test_only_the_store_deletes_or_renames_under_the_output_root() -> None:
    found = sorted(f"{rel}:{n}: {line.strip()}" for path in _modules("pipelines", "transforms")
                   if not (rel := path.relative_to(REPO).as_posix()).startswith("transforms/store/")
                   and rel not in REMOVES_ELSEWHERE
                   for n, line in enumerate(path.read_text().splitlines(), 1) if REMOVES.search(line))
    assert not found, "files deleted or renamed outside transforms/store/:\n" + "\n".join(found)
    assert all((REPO / rel).is_file() and REMOVES.search((REPO / rel).read_text()) for rel in REMOVES_ELSEWHERE)


def test_the_removal_pattern_finds_what_it_is_for() -> None:
    removes = ["FileSystems.delete(found)", "FileSystems.rename([a], [b])", "os.remove(p)", "os.replace(tmp, p)",
               "shutil.rmtree(folder)", "probe.unlink()", "Path(a).rename(b)", "os.unlink(p)"]
    assert all(REMOVES.search(r) for r in removes)
    fine = ['text.replace("a", "b")', "FileSystems.create(path)", "FileSystems.exists(m)", "value.replace(tzinfo=x)"]
    assert not any(REMOVES.search(f) for f in fine)
