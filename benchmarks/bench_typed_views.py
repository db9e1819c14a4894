"""Wall time and peak RSS of `pagemill sql "SELECT 1"` after a run with a big user schema (issue 32, finding 5).

The typed views (pipelines/tables/typed_views.py) make one view per extraction schema on every connection;
a deep and wide user schema made main's views' SQL grow with depth x width (80 KiB: 6.1 s and 1.6 GB; 156 KiB:
16-20 s and 4.1 GB, and DuckDB then refused the view). This plants an output root per schema size with the
real writer (tests/support/planted.py): one `ok` page of a generated schema (`deep_wide_schema`: objects
nested `--depth` levels, each with about `width` typed properties and a list of objects, widened until the file
reaches the size asked for) and a manifest naming the file, as `pagemill run --schema FILE` leaves them. Then it
runs `pagemill sql --output ROOT "SELECT 1"` in a fresh process per size, once with this checkout and once
with `--repo` (a baseline checkout, e.g. main's code: `git archive HEAD | tar -x -C ../base`), and prints wall
and CPU seconds and the process's peak RSS; `--count` also times `SELECT count(*)` from the big view (which
creates it), `--notes` prints what typed_views says of it. `--evidence-pages N` also plants N `ok` invoice pages
with an `evidence` row per value (as a run leaves them) and times reading the invoice view whole (`SELECT *`,
its `<field>_grounded` and `<field>_box` columns joined from `evidence`) and its `count(*)`. Asserts nothing.

    .venv/bin/python benchmarks/bench_typed_views.py [--sizes-kib 80 156] [--repo ../base] [--rounds 1] [--count]
        [--evidence-pages 20000]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LEAF_TYPES = ({"type": "string", "pattern": "^[A-Za-z0-9 .,-]{0,40}$"}, {"type": "number", "minimum": 0,
              "maximum": 1000000}, {"type": "integer", "minimum": 0, "maximum": 1000}, {"type": "boolean"},
              {"type": "string", "format": "date"})


def deep_wide_schema(width: int, depth: int) -> dict[str, Any]:
    """An object schema nested `depth` levels: each level has `width` scalar properties, a nested object
    `next` (the level below) and `rows`, a bounded list of objects of `width // 4` scalars."""
    def level(d: int) -> dict[str, Any]:
        props: dict[str, Any] = {f"field_{d}_{i:03d}": LEAF_TYPES[i % len(LEAF_TYPES)] for i in range(width)}
        props[f"rows_{d}"] = {"type": "array", "maxItems": 4, "items": {
            "type": "object", "properties": {f"cell_{d}_{i:02d}": LEAF_TYPES[i % len(LEAF_TYPES)]
                                             for i in range(max(width // 4, 1))}}}
        if d < depth:
            props[f"next_{d}"] = level(d + 1)
        return {"type": "object", "properties": props}

    return {"title": "deep_wide", **level(1)}


def schema_of_size(kib: int, depth: int) -> dict[str, Any]:
    """`deep_wide_schema` at `depth`, its width grown until the JSON text reaches `kib` KiB."""
    width = 1
    while len(json.dumps(deep_wide_schema(width, depth))) < kib * 1024:
        width += 1
    return deep_wide_schema(width, depth)


def example(schema: dict[str, Any]) -> Any:
    """A value of `schema` (the first of each kind), for the planted `ok` page."""
    if "properties" in schema:
        return {k: example(v) for k, v in schema["properties"].items()}
    if schema.get("type") == "array":
        return [example(schema["items"])]
    return {"string": "2026-11-03" if schema.get("format") == "date" else "text", "number": 12.5,
            "integer": 7, "boolean": True}[schema["type"]]


def plant(root: Path, kib: int, depth: int) -> Path:
    """An output root after a run with a `kib` KiB user schema: one `ok` page and the run's manifest."""
    from tests.support import planted

    schema = schema_of_size(kib, depth)
    path = root / f"deep_wide_{kib}.json"
    path.write_text(json.dumps(schema))
    out = root / f"out-{kib}"
    planted.write_pages(out, [planted.page(1, example(schema), schema_id=path.stem, schema=schema)])
    planted.write_manifest(out, "r1", str(path))
    return out


def plant_evidence(root: Path, pages: int) -> Path:
    """An output root of `pages` ok invoice pages, each with its evidence rows (every value found, with a box)."""
    import datetime as dt

    from schemas import tables
    from schemas.layout import partition
    from tests.support import planted
    from transforms.model.evidence import leaves
    from transforms.store.write import write_rows

    out = root / "out-evidence"
    rows = [planted.page(n, planted.GOOD_INVOICE) for n in range(pages)]
    planted.write_pages(out, rows)
    at = dt.datetime(2026, 11, 1, 9, tzinfo=dt.UTC)
    evidence = [{"run_id": "r1", "tenant": "default", "doc_sha256": r["doc_sha256"], "source_uri": r["source_uri"],
                 "page_index": 0, "status": "ok", "schema_id": "invoice", "field_path": path, "value": str(v),
                 "quote": str(v), "x0": 0.1, "y0": 0.2, "x1": 0.3, "y1": 0.25, "method": "text_layer", "score": 1.0,
                 "grounded": True, "created_at": at}
                for r in rows for path, v in leaves(planted.GOOD_INVOICE)]
    write_rows(partition(str(out), "evidence", "default", "r1"), tables.EVIDENCE, evidence)
    return out


def measure(repo: Path, output: Path, statement: str) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MiB, the answer's last line) of `pagemill sql STATEMENT` in its own process."""
    argv = [sys.executable, "-m", "pipelines.cli", "sql", "--output", str(output), "--format", "csv", statement]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    text = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    answer = text.strip().splitlines()[-1] if proc.returncode == 0 else f"exit {proc.returncode}: {text[-300:]}"
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, answer  # ru_maxrss: KiB on Linux


def typed_note(repo: Path, output: Path, view: str) -> str:
    """What the checkout's typed_views says of the big schema's view (a refused view says so here)."""
    query = f"SELECT note FROM typed_views WHERE view = '{view}'"
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "sql", "--output", str(output), "--format", "json",
                           query], cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        return f"exit {proc.returncode}"
    rows = json.loads(proc.stdout)
    return (rows[0]["note"] or "")[:160] if rows else "no view"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[80, 156])
    parser.add_argument("--depth", type=int, default=12, help="levels of nested objects in the schema")
    parser.add_argument("--repo", type=Path, default=None, help="a baseline checkout, measured the same way")
    parser.add_argument("--rounds", type=int, default=1, help="runs per size and checkout (the best is printed)")
    parser.add_argument("--count", action="store_true", help="also time SELECT count(*) FROM the big view")
    parser.add_argument("--notes", action="store_true", help="also print each view's note (one more query each)")
    parser.add_argument("--evidence-pages", type=int, default=0, help="also read an invoice view of this many pages "
                        "with their evidence rows")
    args = parser.parse_args()
    # SELECT 1 reads no typed view; the count reads the big one (the cost of a view within the bound).
    statements = ["SELECT 1", "SELECT count(*) FROM {view}"] if args.count else ["SELECT 1"]
    checkouts = [("this checkout", REPO)] + ([("baseline", args.repo.resolve())] if args.repo else [])
    with tempfile.TemporaryDirectory(prefix="bench-typed-views-") as tmp:
        roots = {0: Path(tmp) / "empty"} | {kib: plant(Path(tmp), kib, args.depth) for kib in args.sizes_kib}
        print(f"pagemill sql \"SELECT 1\", one ok page of a generated schema, depth {args.depth}; "
              f"best of {args.rounds}; load {os.getloadavg()[0]:.1f}")
        print("schema KiB 0: an empty output root (start-up, imports and the shipped views' plan: the floor)")
        print("| checkout | schema KiB | SELECT | wall s | CPU s | peak RSS MiB | answer |")
        print("|---|---:|---|---:|---:|---:|---|")
        for kib, out in roots.items():
            for (name, repo), statement in itertools.product(checkouts, statements[:2 if kib else 1]):
                runs = [measure(repo, out, statement.format(view=f"deep_wide_{kib}")) for _ in range(args.rounds)]
                wall, cpu, rss, answer = min(runs)
                print(f"| {name} | {kib} | {statement.split()[1]} | {wall:.2f} | {cpu:.2f} | {rss:.0f} | {answer} |",
                      flush=True)
                if args.notes and kib and statement == statements[-1]:
                    print(f"|   note | | | | | | {typed_note(repo, out, f'deep_wide_{kib}')} |", flush=True)
        if args.evidence_pages:
            out = plant_evidence(Path(tmp), args.evidence_pages)
            print(f"\n{args.evidence_pages} ok invoice pages, {len(list(leaves_of_invoice()))} evidence rows each")
            print("| checkout | SELECT | wall s | CPU s | peak RSS MiB | answer |")
            print("|---|---|---:|---:|---:|---|")
            for statement, (name, repo) in itertools.product(
                    ["SELECT count(*) FROM invoice", "SELECT * FROM invoice"], checkouts):
                wall, cpu, rss, answer = min(measure(repo, out, statement) for _ in range(args.rounds))
                print(f"| {name} | {statement} | {wall:.2f} | {cpu:.2f} | {rss:.0f} | {answer[:40]} |", flush=True)


def leaves_of_invoice() -> Any:
    from tests.support import planted
    from transforms.model.evidence import leaves

    return leaves(planted.GOOD_INVOICE)


if __name__ == "__main__":
    main()
