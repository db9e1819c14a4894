"""`pagemill eval --bench NAME --data DIR --output OUT` scores a run on a public benchmark; `pagemill bench NAME
--data DIR --output OUT [run flags]` runs the pipeline over the benchmark's documents and then scores it, printing
one comparison line: benchmark, model, pages, score, $ per 1,000 pages, pages per second (wall time of the run).

A run's page is matched to the benchmark's document by its source URI (`.../pdfs/<pdf>` for olmOCR-Bench, the
image's file name for SROIE and CORD); a duplicate document is scored on the pages of the one it duplicates, and a
document or page that has no row scores as nothing extracted.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pipelines.bench import cord, olmocr_bench, sroie
from pipelines.config.storage import StorageConfig, add_storage_args, configure, storage_from
from pipelines.tables import sql
from schemas.records import model_routes_sql
from schemas.statuses import DUPLICATE, OK, PAGE_STATUSES


@dataclass(frozen=True)
class Bench:
    name: str
    preset: str
    schema: str | None  # a schema file of schemas/extraction/ (None: the preset's output)
    inputs: Callable[[Path], list[str]]  # the documents `pagemill bench` runs over


BENCHES: Mapping[str, Bench] = {
    "olmocr-bench": Bench("olmocr-bench", "olmocr", None, lambda d: [str(d / "pdfs")]),
    "sroie": Bench("sroie", "qwen2.5-vl", "sroie.json", lambda d: [str(r.image) for r in sroie.load(d)]),
    "cord": Bench("cord", "qwen2.5-vl", "cord.json", lambda d: [str(r.image) for r in cord.load(d)]),
}


def schema_path(file_name: str) -> str:
    return str(resources.files("schemas.extraction") / file_name)


def run_pages(output: str, storage: StorageConfig | None, run_id: str | None, tenant: str | None
              ) -> dict[str, Any]:
    """The run's pages by (source URI, page index), duplicate documents resolved, and its ledger and wall time."""
    from pipelines.tables.report import find_run

    tenant, run_id = find_run(output, storage, run_id, tenant)
    con = sql.connect(output, storage, tenant)
    try:
        rows = con.execute("SELECT source_uri, page_index, extraction, markdown FROM pages WHERE run_id = ?",
                           [run_id]).fetchall()
        aliases = dict(con.execute("SELECT source_uri, duplicate_of FROM documents WHERE run_id = ? "
                                   f"AND outcome = '{DUPLICATE}' AND duplicate_of IS NOT NULL", [run_id]).fetchall())
        uris = [u for (u,) in con.execute("SELECT source_uri FROM documents WHERE run_id = ?", [run_id]).fetchall()]
        ledger = con.execute(f"SELECT count(*), count(*) FILTER (WHERE {model_routes_sql()}), "
                             "coalesce(sum(cost_usd), 0) FROM ledger WHERE run_id = ?", [run_id]).fetchone()
        wall = con.execute("SELECT max(wall_seconds) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        models = [m for (m,) in con.execute("SELECT DISTINCT model FROM pages WHERE run_id = ? AND model IS NOT NULL "
                                            "ORDER BY 1", [run_id]).fetchall()]
        statuses = dict(con.execute("SELECT status, count(*) FROM pages WHERE run_id = ? GROUP BY 1",
                                    [run_id]).fetchall())
    finally:
        con.close()
    pages = {(u, i): {"extraction": e, "markdown": m} for u, i, e, m in rows}
    for uri, original in aliases.items():
        pages.update({(uri, i): v for (u, i), v in list(pages.items()) if u == original})
    return {"run_id": run_id, "tenant": tenant, "pages": pages, "uris": uris, "ledger_pages": ledger[0],
            "model_pages": ledger[1], "cost_usd": float(ledger[2]), "wall_seconds": wall, "models": models,
            "statuses": statuses}


def find_uri(uris: Sequence[str], suffix: str) -> str | None:
    """The one URI that ends with `/suffix` (None when none or several do)."""
    found = [u for u in uris if u.endswith("/" + suffix)]
    return found[0] if len(found) == 1 else None


def _json(text: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def score_run(name: str, data: Path, run: Mapping[str, Any]) -> dict[str, Any]:
    """The benchmark's scores of a run (from run_pages)."""
    pages, uris = run["pages"], run["uris"]
    if name == "olmocr-bench":
        dataset = olmocr_bench.load(data)
        markdown: dict[tuple[str, int], str | None] = {}
        for pdf in dataset.pdfs:
            uri = find_uri(uris, "pdfs/" + pdf)
            for (u, i), page in pages.items():
                if u == uri:
                    markdown[(pdf, i + 1)] = page["markdown"]
        from pipelines.bench.olmocr_math import math_rule

        with math_rule() as (rule, note):
            return olmocr_bench.score(dataset, markdown, math=rule, math_note=note)
    receipts = sroie.load(data) if name == "sroie" else cord.load(data)
    got = {}
    for r in receipts:
        uri = find_uri(uris, r.image.name if name == "sroie" else r.id)
        got[r.id] = _json(pages.get((uri, 0), {}).get("extraction")) if uri else None
    truth = {r.id: r.truth for r in receipts}
    return sroie.score(truth, got) if name == "sroie" else cord.score(truth, got)


def pages_field(pages: int, statuses: Mapping[str, int]) -> str:
    """`pages N (ok A, invalid B, ...)`: the ledger's page count, then the `pages` table's statuses in the
    vocabulary's order, `ok` always (a run whose every page was invalid must not read like one that answered)."""
    shown = [f"ok {statuses.get(OK, 0)}"] + [f"{s} {statuses[s]}" for s in PAGE_STATUSES if s != OK and statuses.get(s)]
    return f"pages {pages} ({', '.join(shown)})"


def score_field(name: str, result: Mapping[str, Any]) -> str:
    """The score as the benchmark's leaders publish it, with what it rests on."""
    if name == "olmocr-bench":
        low, high = result["ci95"]
        rule = "exact LaTeX only" if result["exact_math_only"] else "exact or rendered alike (KaTeX)"
        unscored = f"; {len(result['unscored'])} unscored, counted failed" if result.get("unscored") else ""
        return f"score {100 * result['score']:.1f}% (95% CI {100 * low:.1f}-{100 * high:.1f}; math {rule}{unscored})"
    if name == "cord":  # Donut publishes nTED accuracy; its field F1 is printed beside it, named
        return (f"nTED accuracy {100 * result['ted_accuracy']:.1f}% (Donut's published metric), "
                f"field F1 {100 * result['f1']:.1f}%")
    return f"score {100 * result['score']:.1f}% (F1)"


def comparison_line(name: str, result: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """The line to paste beside published scores."""
    pages, wall = run["ledger_pages"], run["wall_seconds"]
    per_1k = f"${1000 * run['cost_usd'] / pages:.4f}" if pages else "n/a"
    speed = f"{pages / wall:.3f}" if pages and wall else "n/a"
    return (f"{name} | model {', '.join(run['models']) or 'none'} | {pages_field(pages, run['statuses'])} | "
            f"{score_field(name, result)} | $/1k pages {per_1k} | pages/s {speed}")


def report(name: str, data: Path, output: str, storage: StorageConfig | None, run_id: str | None,
           tenant: str | None) -> tuple[dict[str, Any], list[str]]:
    run = run_pages(output, storage, run_id, tenant)
    result = score_run(name, data, run)
    renderer = {"olmocr-bench": olmocr_bench.render, "sroie": sroie.render, "cord": cord.render}[name]
    correct = result.get("correct_fields")
    cost = {"pages": run["ledger_pages"], "model_pages": run["model_pages"], "cost_usd": run["cost_usd"],
            "wall_seconds": run["wall_seconds"],
            "usd_per_correct_field": run["cost_usd"] / correct if correct else None}
    lines = [f"pagemill bench: run {run['run_id']} (tenant {run['tenant']}) on {name} at {data}",
             *renderer(result), comparison_line(name, result, run)]
    return {"run_id": run["run_id"], "tenant": run["tenant"], **result, "cost": cost,
            "line": lines[-1]}, lines


def _parser(prog: str, storage: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    parser.add_argument("--output", required=True, help="the run's output root")
    parser.add_argument("--data", required=True, help="the benchmark's folder, in its own layout")
    parser.add_argument("--run-id", default=None)
    parser.add_argument("--tenant", default=None)
    parser.add_argument("--format", choices=("table", "json"), default="table")
    if storage:
        add_storage_args(parser)
    return parser


def _score_and_print(name: str, args: argparse.Namespace, storage: StorageConfig, prog: str) -> int:
    try:
        result, lines = report(name, Path(args.data), args.output, storage, args.run_id, args.tenant)
    except (OSError, ValueError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1, default=str) if args.format == "json" else "\n".join(lines))
    return 0


def eval_command(argv: Sequence[str]) -> int:
    """`pagemill eval --bench NAME --data DIR --output OUT [--run-id ID] [--tenant T] [--format table|json]`."""
    parser = _parser("pagemill eval")
    parser.add_argument("--bench", required=True, choices=sorted(BENCHES))
    args = parser.parse_args(argv)
    return _checked(args, "pagemill eval") or _score_and_print(args.bench, args, storage_from(vars(args)),
                                                               "pagemill eval")


def _checked(args: argparse.Namespace, prog: str) -> int:
    from schemas.layout import check_identifier

    bad = check_identifier("--run-id", args.run_id) or check_identifier("--tenant", args.tenant)
    if bad:
        print(f"{prog}: {bad}", file=sys.stderr)
        return 2
    configure(storage_from(vars(args)))
    return 0


def bench_command(argv: Sequence[str], run_command: Callable[[Sequence[str]], int]) -> int:
    """`pagemill bench NAME --data DIR --output OUT [--preset P] [--run-id ID] [run flags]`: run (with the command
    line's `pagemill run`, handed in by pipelines/cli.py), then score."""
    parser = _parser("pagemill bench", storage=False)  # storage flags stay in run_flags: the run needs them too
    parser.usage = "pagemill bench NAME --data DIR --output OUT [options] [pagemill run options]"
    parser.epilog = ("Any other option is passed to the run, after the ones the bench sets (so it wins): every "
                     "option of `pagemill run --help`, e.g. --model, --max-tokens, --engine, --runner, and the "
                     "storage flags, which the scoring uses too.")
    parser.add_argument("bench", choices=sorted(BENCHES))
    parser.add_argument("--preset", default=None, help="default: olmocr for olmocr-bench, qwen2.5-vl otherwise")
    args, run_flags = parser.parse_known_args(argv)
    store = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_storage_args(store)
    vars(args).update(vars(store.parse_known_args(run_flags)[0]))
    if _checked(args, "pagemill bench"):
        return 2
    bench = BENCHES[args.bench]
    try:
        inputs = bench.inputs(Path(args.data))
        if args.bench == "olmocr-bench":
            olmocr_bench.load(args.data)  # a folder that is not the benchmark fails before the run
    except (OSError, ValueError) as err:
        print(f"pagemill bench: {err}", file=sys.stderr)
        return 2
    run_id = args.run_id or f"bench-{args.bench}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}"
    flags = ["--preset", args.preset or bench.preset, "--output", args.output, "--run-id", run_id]
    flags += [x for i in inputs for x in ("--input", i)]
    flags += ["--schema", schema_path(bench.schema)] if bench.schema else []
    flags += ["--tenant", args.tenant] if args.tenant else []
    code = run_command(flags + list(run_flags))  # the run's own flags (--model, --max-tokens, ...) come last: they win
    if code != 0:
        print(f"pagemill bench: the run exited {code}; scoring what it wrote", file=sys.stderr)
    args.run_id = run_id
    scored = _score_and_print(args.bench, args, storage_from(vars(args)), "pagemill bench")
    return code or scored
