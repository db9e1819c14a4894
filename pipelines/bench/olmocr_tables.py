"""Tables inside a page's markdown, as olmOCR-Bench's `table` tests see them: markdown pipe tables and HTML
`<table>`s become a grid of cells with up/down/left/right neighbours and heading walks.

Written from the definition in allenai/olmocr `olmocr/bench/table_parsing.py` (the benchmark's reference
scorer): cells are placed on an occupancy grid that honours rowspan/colspan, a cell's neighbour in a direction
is the first other cell met walking that way from any row or column it covers, and a heading walk follows one
direction to the table's edge and returns the heading cells met (else the cells at the edge). In a markdown
table the first row and the first column are headings; in HTML, `<th>` cells and rows inside `<thead>`.
benchmarks/bench_scorer_agreement.py checks every verdict against the reference.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Cell = tuple[int, int]
Relations = Mapping[Cell, frozenset[Cell]]


@dataclass(frozen=True)
class CellSpec:
    text: str
    rowspan: int = 1
    colspan: int = 1
    heading: bool = False


@dataclass(frozen=True)
class Table:
    cells: Mapping[Cell, str]  # (row, col) of a cell's top-left slot -> its text
    headings: frozenset[Cell]
    up: Relations
    down: Relations
    left: Relations
    right: Relations

    def _walk(self, start: Cell, relation: Relations) -> set[Cell]:
        headings, ends, seen, todo = set(), set(), set(), {start}
        while todo:
            cur = todo.pop()
            seen.add(cur)
            if cur in self.headings:
                headings.add(cur)
            if not relation.get(cur):
                ends.add(cur)
            else:
                todo |= relation[cur]  # the reference revisits nothing new: the grid has no cycles one way
        headings.discard(start)
        ends.discard(start)
        return headings or ends

    def top_heading(self, cell: Cell) -> set[Cell]:
        return self._walk(cell, self.up)

    def left_heading(self, cell: Cell) -> set[Cell]:
        return self._walk(cell, self.left)


def span(value: Any) -> int:
    """A rowspan/colspan attribute as a positive int (1 when absent or unreadable)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return 1
    return number if number > 0 else 1


def _occupancy(rows: Sequence[Sequence[CellSpec]]) -> tuple[list[list[Cell | None]], dict[Cell, CellSpec]]:
    grid: list[list[Cell | None]] = []
    placed: dict[Cell, CellSpec] = {}
    pending: list[tuple[Cell, int] | None] = []  # per column: the cell a rowspan carries down, rows left
    for r, specs in enumerate(rows):
        line: list[Cell | None] = []
        col = i = 0
        while i < len(specs) or col < len(pending):
            if col < len(pending) and pending[col] is not None:
                cell, left = pending[col]
                line.append(cell)
                pending[col] = (cell, left - 1) if left > 1 else None
                col += 1
                continue
            if i >= len(specs):
                line.append(None)
                col += 1
                continue
            spec = specs[i]
            i += 1
            cell = (r, col)
            placed[cell] = spec
            pending.extend([None] * (col + spec.colspan - len(pending)))
            for c in range(col, col + spec.colspan):
                line.append(cell)
                pending[c] = (cell, spec.rowspan - 1) if spec.rowspan > 1 else None
            col += spec.colspan
        grid.append(line)
    while any(p is not None for p in pending):  # rowspans that reach past the last row
        line = []
        for c, p in enumerate(pending):
            line.append(None if p is None else p[0])
            if p is not None:
                pending[c] = (p[0], p[1] - 1) if p[1] > 1 else None
        grid.append(line)
    return grid, placed


def _first(grid: list[list[Cell | None]], cell: Cell, slots: Sequence[tuple[int, int]]) -> Cell | None:
    for r, c in slots:
        found = grid[r][c]
        if found is not None and found != cell:
            return found
    return None


def build(rows: Sequence[Sequence[CellSpec]]) -> Table | None:
    """The table of `rows` of cell specs, or None when it has no cell."""
    grid, placed = _occupancy(rows)
    used = [c for line in grid for c, v in enumerate(line) if v is not None]
    if not placed or not used:
        return None
    width, height = max(used) + 1, len(grid)
    for line in grid:
        line[width:] = []
        line.extend([None] * (width - len(line)))
    directions = ("up", "down", "left", "right")
    rel: dict[str, dict[Cell, set[Cell]]] = {k: {cell: set() for cell in placed} for k in directions}
    for cell, spec in placed.items():
        r0, c0 = cell
        r1, c1 = r0 + spec.rowspan - 1, c0 + spec.colspan - 1
        walks = {
            "right": [[(r, c) for c in range(c1 + 1, width)] for r in range(r0, min(r1, height - 1) + 1)],
            "left": [[(r, c) for c in range(c0 - 1, -1, -1)] for r in range(r0, min(r1, height - 1) + 1)],
            "down": [[(r, c) for r in range(r1 + 1, height)] for c in range(c0, min(c1, width - 1) + 1)],
            "up": [[(r, c) for r in range(r0 - 1, -1, -1)] for c in range(c0, min(c1, width - 1) + 1)],
        }
        for name, lines in walks.items():
            for slots in lines:
                found = _first(grid, cell, slots)
                if found is not None:
                    rel[name][cell].add(found)
    frozen = {k: {c: frozenset(v) for c, v in d.items()} for k, d in rel.items()}
    return Table({c: s.text for c, s in placed.items()}, frozenset(c for c, s in placed.items() if s.heading),
                 frozen["up"], frozen["down"], frozen["left"], frozen["right"])


def _markdown_rows(lines: Sequence[str]) -> list[list[str]]:
    separator = next((i for i, line in enumerate(lines)
                      if line.replace("|", "").strip() and all(ch in "- :" for ch in line.replace("|", "").strip())),
                     None)
    rows = []
    for i, line in enumerate(lines):
        if i == separator or (line.strip() and all(ch in "- :|" for ch in line)):
            continue
        cells = [cell.strip() for cell in line.split("|")]
        if cells and cells[0] == "":
            cells = cells[1:]
        if cells and cells[-1] == "":
            cells = cells[:-1]
        if cells:
            rows.append(cells)
    return rows


def markdown_tables(text: str) -> list[Table]:
    """Every run of two or more consecutive lines holding a `|`, as a table."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.strip().split("\n"):
        if "|" in line:
            if current is None:
                current = []
                blocks.append(current)
            current.append(line)
        else:
            current = None
    tables = []
    for block in blocks:
        rows = _markdown_rows(block) if len(block) >= 2 else []
        specs = [[CellSpec(cell, heading=r == 0 or c == 0) for c, cell in enumerate(row)] for r, row in enumerate(rows)]
        table = build(specs) if specs else None
        if table is not None:
            tables.append(table)
    return tables


def html_tables(text: str) -> list[Table]:
    """Every `<table>` (BeautifulSoup's html.parser, as the reference): rows are all its `<tr>`s."""
    from bs4 import BeautifulSoup

    tables = []
    for element in BeautifulSoup(text, "html.parser").find_all("table"):
        trs = element.find_all("tr")
        rows = []
        for r, tr in enumerate(trs):
            in_head = tr.find_parent("thead") is not None
            row = []
            for td in tr.find_all(["th", "td"], recursive=False):
                for br in td.find_all("br"):
                    br.replace_with("\n")
                raw = td.get("rowspan")
                rowspan = max(1, len(trs) - r) if isinstance(raw, str) and raw.strip() == "0" else span(raw)
                row.append(CellSpec(td.get_text(separator="").strip(), rowspan, span(td.get("colspan")),
                                    td.name == "th" or in_head))
            rows.append(row)
        table = build(rows) if rows else None
        if table is not None:
            tables.append(table)
    return tables
