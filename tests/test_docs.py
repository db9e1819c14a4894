"""The front door stays short and every page it leads to exists; the options reference matches the code."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _gen_module():
    spec = importlib.util.spec_from_file_location("gen_options_doc", REPO / "scripts" / "gen_options_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_options_doc_is_generated_from_the_code() -> None:
    expected = _gen_module().render()
    current = (REPO / "docs" / "options.md").read_text()
    assert current == expected, "docs/options.md is out of date: run `python scripts/gen_options_doc.py`"


def test_every_run_option_is_in_the_options_doc() -> None:
    """Independent of the generator: every flag `pagemill run` accepts has a row with its default."""
    from pipelines.config.options import PagemillOptions

    doc = (REPO / "docs" / "options.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `--([\w-]+)` \|.*$", doc, re.M)}
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    PagemillOptions._add_argparse_args(parser)
    names = {a.dest for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS}
    assert names, "no options found"
    assert {n.replace("_", "-") for n in names} == set(rows)
    defaults = parser.parse_args([])
    for name in names:
        value = getattr(defaults, name)
        if value is not None and not isinstance(value, bool):
            assert f"`{value}`" in rows[name.replace("_", "-")], name


def test_the_generator_check_fails_on_a_stale_file(tmp_path: Path, monkeypatch) -> None:
    module = _gen_module()
    stale = tmp_path / "options.md"
    stale.write_text(module.render().replace("`5000`", "`5001`"))
    monkeypatch.setattr(module, "TARGET", stale)
    monkeypatch.setattr(module, "REPO", tmp_path)
    assert module.main(["--check"]) == 1
    assert module.main([]) == 0 and module.main(["--check"]) == 0


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move reference text to docs/"
    head = "\n".join(lines[:15])
    assert "\nmake demo " in head and "\nmake test " in head


def _anchors(text: str) -> set[str]:
    found, in_code = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def _broken_links(pages: list[Path], root: Path) -> list[str]:
    broken = []
    for page in sorted(pages):
        text = page.read_text()
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(root)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def test_relative_links_point_at_existing_files_and_headings() -> None:
    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    assert len(pages) > 5
    broken = _broken_links(pages, REPO)
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# A\n[b](b.md) [self](#a) [gone](#nope)\n")
    assert _broken_links([page], tmp_path) == ["a.md: b.md (no such file)", "a.md: #nope (no such heading)"]


def _vocabulary_tables(text: str) -> dict[str, set[str]]:
    """The first column of each table under docs/tables.md's outcomes-and-statuses heading, by header."""
    section = text.split("## Outcomes and page statuses", 1)[1].split("\n## ", 1)[0]
    tables: dict[str, set[str]] = {}
    header = None
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            header = None
        elif header is None:
            header = cells[0]
            tables[header] = set()
        elif not set(cells[0]) <= set("-: "):
            tables[header].add(cells[0].strip("`"))
    return tables


def test_tables_doc_lists_exactly_the_status_vocabulary() -> None:
    from schemas.statuses import OUTCOMES, PAGE_STATUSES

    tables = _vocabulary_tables((REPO / "docs" / "tables.md").read_text())
    assert tables.get("outcome") == set(OUTCOMES), "docs/tables.md outcomes differ from schemas/statuses.py"
    assert tables.get("status") == set(PAGE_STATUSES), "docs/tables.md statuses differ from schemas/statuses.py"


def test_the_vocabulary_check_sees_a_missing_or_extra_row() -> None:
    doc = ("## Outcomes and page statuses\n\n| outcome | meaning |\n|---|---|\n| `extracted` | x |\n\n"
           "| status | meaning |\n|---|---|\n| `ok` | x |\n| `bogus` | y |\n\n## Next\n| `later` | z |\n")
    assert _vocabulary_tables(doc) == {"outcome": {"extracted"}, "status": {"ok", "bogus"}}


# docs/development.md's tree: a line that starts at the margin names a folder (`transforms/model/`) or a file
# (`transforms/text_safety.py`); the names after it, on that line and the indented ones below, are files in
# that folder, or paths from the repository root (`transforms/store/listing_file.py`) or from the folder's
# parent room (`intake/timed.py` under `transforms/`).
FILE_NAME = re.compile(r"(?<![\w./*-])([\w./-]+\.(?:py|json|yaml|html))\b")


def _layout_tree(text: str) -> str:
    """The code block of the Layout section that holds the tree (the one naming `transforms/intake/`)."""
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")[1::2]
    return next(b for b in blocks if "\ntransforms/intake/" in b)


def _named_files(tree: str, root: Path) -> set[str]:
    """Every file the tree names, as a path from the repository root."""
    named: set[str] = set()
    folder = ""
    for line in tree.splitlines():
        if line and not line[0].isspace():
            head, _, line = line.partition(" ")
            folder = head if head.endswith("/") else head.rpartition("/")[0] + "/"
            if not head.endswith("/"):
                named.add(head)
        for name in FILE_NAME.findall(line):
            top = name.split("/")[0]
            if "/" in name and (root / top).is_dir():
                named.add(name)
            elif "/" in name:  # from the folder's room: intake/timed.py under transforms/
                named.add(folder.split("/")[0] + "/" + name)
            else:
                named.add(folder + name)
    return named


def test_the_layout_tree_names_every_module_and_only_files_that_exist() -> None:
    named = _named_files(_layout_tree((REPO / "docs" / "development.md").read_text()), REPO)
    modules = {str(p.relative_to(REPO)) for folder in ("transforms", "pipelines") for p in (REPO / folder).rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts}
    assert len(modules) > 60  # the folders were found
    missing = sorted(modules - named)
    assert not missing, "modules not named in docs/development.md's Layout tree:\n" + "\n".join(missing)
    gone = sorted(n for n in named if not (REPO / n).is_file())
    assert not gone, "files named in docs/development.md's Layout tree that do not exist:\n" + "\n".join(gone)


def test_the_layout_tree_reader_resolves_each_kind_of_name(tmp_path: Path) -> None:
    (tmp_path / "transforms").mkdir()
    tree = ("transforms/intake/   a.py (uses transforms/pages/b.py), c.py\n"
            "                     d.py (e.json)\n"
            "transforms/f.py      what intake/g.py and pages/h.py share\n"
            "schemas/     extraction/*.json, prices.json\n")
    assert _named_files(tree, tmp_path) == {
        "transforms/intake/a.py", "transforms/pages/b.py", "transforms/intake/c.py", "transforms/intake/d.py",
        "transforms/intake/e.json", "transforms/f.py", "transforms/intake/g.py", "transforms/pages/h.py",
        "schemas/prices.json"}
