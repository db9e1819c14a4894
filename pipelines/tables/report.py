"""`pagemill report --output URI [--run-id ID] --html FILE`: one self-contained HTML file about one run.

The figures come from the tables (through `pipelines.tables.sql` and the named queries) and the run's manifest;
the page (`report_template.html`) draws them as inline SVG with its own small script: no CDN, no network,
nothing fetched. Every string from the data (file names, reason messages) is written with `textContent`
by the script or escaped here, never parsed as HTML, and the data block cannot close its `<script>`.

Pages/s: the run's pages/s (pages / manifest wall time), the engine's (model pages / summed GPU-seconds),
the render stage's (from the manifest's `render_ms` distribution, per worker thread); the run's timeline
(pages leaving the CPU stages and results coming back, per second, from `pages.rendered_at` and
`pages.extracted_at`: the two overlap when the model is fed while pages are still rendered); and pages/s
of every run under the output root over time, the current one marked.
"""
from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import html
import json
import re
import sys
from collections.abc import Sequence
from importlib import resources
from typing import Any

import duckdb
from apache_beam.io.filesystems import FileSystems

from pipelines.config.storage import StorageConfig, add_storage_args, configure, storage_from
from pipelines.tables import queries, sql
from schemas.records import is_model_route, model_routes_sql
from schemas.statuses import (
    CACHED,
    DUPLICATE,
    EXTRACTED,
    FAILED,
    INVALID,
    OK,
    PARTIAL,
    QUARANTINED,
    REJECTED,
    RENDERED,
)

HISTOGRAM_BINS = 12


def latest_run(con: duckdb.DuckDBPyConnection) -> tuple[str, str] | None:
    """(tenant, run id) of the run whose rows were written last (every row of a run carries its start
    time); over one tenant's rows when the connection is restricted to one."""
    row = con.execute("SELECT tenant, run_id FROM documents GROUP BY ALL "
                      "ORDER BY max(created_at) DESC, run_id DESC, tenant DESC LIMIT 1").fetchone()
    return (row[0], row[1]) if row else None


def find_run(output: str, storage: StorageConfig | None, run_id: str | None,
             tenant: str | None, source: sql.TableSource | None = None) -> tuple[str, str]:
    """(tenant, run id) the report is about: the latest run (of `tenant`, when given), or `run_id`,
    whose tenant must be unambiguous."""
    con = sql.connect(output, storage, tenant, source=source)
    try:
        if run_id is None:
            found = latest_run(con)
            if found is None:
                raise ValueError(f"no run under {output}" + (f" for tenant {tenant!r}" if tenant else ""))
            return found
        owners = [t for (t,) in con.execute("SELECT DISTINCT tenant FROM documents WHERE run_id = ? ORDER BY 1",
                                            [run_id]).fetchall()]
    finally:
        con.close()
    if not owners:
        raise ValueError(f"no run {run_id!r} under {output}" + (f" for tenant {tenant!r}" if tenant else ""))
    if len(owners) > 1:
        raise ValueError(f"run {run_id!r} exists for tenants {', '.join(owners)}: choose one with --tenant")
    return owners[0], run_id


def _dicts(con: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] | dict[str, Any]) -> list[dict[str, Any]]:
    rel = con.execute(query, params)
    columns = [d[0] for d in rel.description]
    return [dict(zip(columns, r, strict=True)) for r in rel.fetchall()]


def funnel(outcomes: dict[str, int]) -> list[dict[str, Any]]:
    """Documents left after each step, in pipeline order, and what the step took away."""
    listed = sum(outcomes.values())
    steps = [("listed", None, 0), ("accepted", "rejected", outcomes.get(REJECTED, 0)),
             ("deduplicated", "duplicates", outcomes.get(DUPLICATE, 0)),
             ("not cached", "cached", outcomes.get(CACHED, 0)),
             ("past the safety gate", "quarantined", outcomes.get(QUARANTINED, 0))]
    out, left = [], listed
    for label, removed, n in steps:
        left -= n
        note = (f"\u2212{n} {removed}" if n else f"0 {removed}") if removed else "every listed object"
        out.append({"label": label, "value": left, "note": note})
    others = ", ".join(f"{outcomes[k]} {k}" for k in (PARTIAL, FAILED, RENDERED) if outcomes.get(k))
    out.append({"label": "extracted", "value": outcomes.get(EXTRACTED, 0), "note": others or "every page ok"})
    return out


def histogram(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """Tokens per model page (image + text + output) in equal-width bins, and the mean of each part."""
    lo, hi, n, img, txt, out = con.execute(
        "SELECT min(t), max(t), count(*), avg(image_tokens), avg(text_tokens), avg(output_tokens) FROM "
        "(SELECT *, image_tokens + text_tokens + output_tokens AS t FROM ledger WHERE run_id = ? AND "
        f"{model_routes_sql()})",
        [run_id]).fetchone()
    if not n:
        return {"bins": [], "pages": 0}
    width = max(1, -(-(hi - lo + 1) // HISTOGRAM_BINS))
    counts = dict(con.execute(
        "SELECT (image_tokens + text_tokens + output_tokens - ?) // ? AS b, count(*) FROM ledger "
        f"WHERE run_id = ? AND {model_routes_sql()} GROUP BY 1", [lo, width, run_id]).fetchall())
    bins = [{"from": lo + i * width, "to": lo + (i + 1) * width - 1, "pages": counts.get(i, 0)}
            for i in range(max(counts) + 1)]
    return {"bins": bins, "pages": n, "mean": {"image": img, "text": txt, "output": out}}


def throughput(con: duckdb.DuckDBPyConnection, run_id: str, manifest: dict[str, Any]) -> dict[str, Any]:
    pages, model_pages, engine_s = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE {model_routes_sql()}), sum(gpu_seconds) FROM ledger "
        "WHERE run_id = ?",
        [run_id]).fetchone()  # the connection holds the run's tenant only
    wall = manifest.get("wall_seconds")
    render = (manifest.get("stage_timings") or {}).get("render_ms")
    runs = _dicts(con, "SELECT run_id, started_at, pages, wall_seconds, pages / nullif(wall_seconds, 0) AS pages_per_s "
                       "FROM runs ORDER BY started_at, run_id", [])
    return {"run": {"pages": pages, "wall_seconds": wall, "pages_per_s": pages / wall if wall else None},
            "timeline": timeline(con, run_id),
            "engine": {"pages": model_pages, "seconds": engine_s,
                       "pages_per_s": model_pages / engine_s if engine_s else None},
            "render": {"pages": render["count"], "seconds": render["sum"] / 1000,
                       "pages_per_s": render["count"] / (render["sum"] / 1000) if render["sum"] else None}
            if isinstance(render, dict) else None,
            "runs": runs}


def timeline(con: duckdb.DuckDBPyConnection, run_id: str, bins: int = 12) -> list[dict[str, float]]:
    """Pages rendered and extracted per second in `bins` equal slices of the run's timestamped span."""
    stamps = con.execute("SELECT epoch(rendered_at), epoch(extracted_at) FROM pages WHERE run_id = ? "
                         "AND rendered_at IS NOT NULL", [run_id]).fetchall()
    if not stamps:
        return []
    t0 = min(r for r, _ in stamps)
    span = max(max(r, e or r) for r, e in stamps) - t0
    width = max(span, 1e-3) / bins
    rendered, extracted = [0] * bins, [0] * bins
    for r, e in stamps:
        rendered[min(bins - 1, int((r - t0) / width))] += 1
        if e is not None:
            extracted[min(bins - 1, int((e - t0) / width))] += 1
    return [{"t": round(i * width, 2), "rendered": rendered[i] / width, "extracted": extracted[i] / width}
            for i in range(bins)]


def collect(output: str, storage: StorageConfig | None = None, run_id: str | None = None,
            tenant: str | None = None, source: sql.TableSource | None = None) -> dict[str, Any]:
    """Everything the report shows, as one JSON-ready dict. Every figure comes from one tenant's rows:
    the run's (other tenants' runs are not in the views at all)."""
    tenant, run_id = find_run(output, storage, run_id, tenant, source)
    con = sql.connect(output, storage, tenant, source=source)
    try:
        outcomes = dict(con.execute("SELECT outcome, count(*) FROM documents WHERE run_id = ? GROUP BY 1",
                                    [run_id]).fetchall())
        if not outcomes:
            raise ValueError(f"no run {run_id!r} under {output}")
        row = con.execute("SELECT manifest FROM runs WHERE run_id = ?", [run_id]).fetchone()
        manifest = json.loads(row[0]) if row else {}
        routes = _dicts(con, "SELECT route, count(*) AS pages, sum(cost_usd) AS cost_usd, "
                             "sum(api_equivalent_usd) AS api_usd, 1000 * sum(cost_usd) / count(*) AS usd_per_1k, "
                             "1000 * sum(api_equivalent_usd) / count(*) AS api_per_1k FROM ledger WHERE run_id = ? "
                             "GROUP BY ALL ORDER BY pages DESC, route", [run_id])
        hist = histogram(con, run_id)
        speed = throughput(con, run_id, manifest)
    finally:
        con.close()
    named = {name: _named(output, storage, name, run_id, tenant)
             for name in ("cost-by-run", "cache-savings", "reject-reasons", "answer-ends", "grounded-by-field")}
    accuracy = accuracy_section(output, tenant, run_id, routes)
    return {"run_id": run_id, "tenant": tenant, "output": output,
            "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "started_at": manifest.get("started_at"), "outcomes": outcomes, "funnel": funnel(outcomes),
            "routes": routes, "histogram": hist, "throughput": speed,
            "reasons": [{"label": f"{r['level']}: {r['reason_code']}", "value": r["n"], "note": r["example"]}
                        for r in named["reject-reasons"]],
            "cost": named["cost-by-run"][0] if named["cost-by-run"] else {}, "savings": named["cache-savings"],
            "answer_ends": answer_ends(named["answer-ends"]), "accuracy": accuracy,
            "grounded": grounded_fields(named["grounded-by-field"]),
            "batches": manifest.get("batches"), "engines": engine_entries(manifest.get("engines")),
            "wall_seconds": manifest.get("wall_seconds")}


def answer_ends(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `answer-ends` query's rows as bars: what the model pages that ended each way cost."""
    return [{"label": str(r["stop_reason"]), "value": r["pages"], "cost_usd": r["cost_usd"] or 0.0,
             "cached_prompt_tokens": r["cached_prompt_tokens"] or 0, "prompt_tokens": r["prompt_tokens"] or 0,
             "note": f"${r['cost_usd'] or 0:,.6f}, {r['output_tokens'] or 0:,} output tokens, "
                     f"{100 * (r['cost_share'] or 0):.0f}% of the model cost; {r['cached_prompt_tokens'] or 0:,} "
                     f"of {r['prompt_tokens'] or 0:,} prompt tokens from the prefix cache"} for r in rows]


def grounded_fields(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pure: the `grounded-by-field` query's rows (one run's) as bars: the share of each field's values found on
    their page (the `evidence` table), and the run's total."""
    several = len({r["schema_id"] for r in rows}) > 1
    fields = [{"label": f"{r['schema_id']}: {r['field']}" if several else str(r["field"]),
               "value": 100 * (r["grounded_share"] or 0.0),
               "note": f"{r['values_grounded']:,} of {r['values_checked']:,} found"
                       + (f", mean score {r['mean_score']:.2f}" if r["mean_score"] is not None else "")}
              for r in rows]
    return {"values": sum(r["values_checked"] for r in rows), "found": sum(r["values_grounded"] for r in rows),
            "fields": fields}


ROUTE_OF_STATUS = {OK: "model", INVALID: "model", CACHED: "cache", DUPLICATE: "duplicate"}


def accuracy_section(output: str, tenant: str, run_id: str, routes: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Per-field accuracy, and accuracy beside cost per page by route, from `pagemill eval --save`'s result
    for this run (None when there is none)."""
    from schemas.layout import eval_path

    path = eval_path(output, tenant, run_id)
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path) as handle:
        r = json.loads(handle.read())
    cost = {x["route"]: x for x in routes}
    # Pages the model answered went by this run's model route: in-process, served or a hosted API.
    model = next((x["route"] for x in routes if is_model_route(str(x["route"]))), "model")
    by_route: dict[str, list[int]] = {}
    for status, t in r.get("by_status", {}).items():
        route = ROUTE_OF_STATUS.get(status, str(status))
        tally = by_route.setdefault(model if route == "model" else route, [0, 0])
        tally[0] += t["correct"]
        tally[1] += t["compared"]
    return {"overall": r["overall"], "truth_rows": r["truth_rows"], "unmatched": len(r["unmatched"]),
            "cost": r["cost"],
            "fields": [{"label": k, "value": 100 * (v["accuracy"] or 0),
                        "note": f"{v['correct']} of {v['compared']} correct, {v['missing']} missing"}
                       for k, v in r["fields"].items()],
            "routes": [{"label": route, "value": 100 * correct / compared if compared else 0,
                        "note": f"{correct} of {compared} fields; "
                                f"${(cost.get(route) or {}).get('usd_per_1k') or 0:,.4f} per 1,000 pages"}
                       for route, (correct, compared) in sorted(by_route.items())]}


def _named(output: str, storage: StorageConfig | None, name: str, run_id: str, tenant: str) -> list[dict[str, Any]]:
    columns, rows = queries.run(output, name, storage, run_id=run_id, tenant=tenant)
    return [dict(zip(columns, r, strict=True)) for r in rows]


def summary_rows(data: dict[str, Any]) -> list[tuple[str, str]]:
    c = data["cost"]
    saved = sum(s["saved_usd"] or 0 for s in data["savings"])
    saved_api = sum(s["saved_api_usd"] or 0 for s in data["savings"])
    t = data["throughput"]["run"]
    rows = [("run", data["run_id"]), ("tenant", str(data.get("tenant"))), ("output", data["output"]),
            ("started", str(data["started_at"] or "unknown")),
            ("documents", f"{sum(data['outcomes'].values()):,} listed: " +
             ", ".join(f"{v:,} {k}" for k, v in sorted(data["outcomes"].items())))]
    if c:
        rows += [("pages", f"{c['pages']:,} ({c['model_pages']:,} through the model, {c['reused_pages']:,} reused)"),
                 ("tokens", f"image {c['image_tokens']:,}, text {c['text_tokens']:,}, output {c['output_tokens']:,}"),
                 ("cost", f"${c['cost_usd']:,.6f} self-hosted (${c['usd_per_1k_pages']:,.4f} per 1,000 pages); "
                          f"${c['api_equivalent_usd']:,.6f} at the hosted API's list price")]
    rows.append(("saved by dedup and cache", f"${saved:,.6f} self-hosted, ${saved_api:,.6f} at API prices"))
    if data["answer_ends"]:
        ends = data["answer_ends"]
        cached, prompt = sum(e["cached_prompt_tokens"] for e in ends), sum(e["prompt_tokens"] for e in ends)
        rows.append(("answers ended", ", ".join(f"{e['value']:,} {e['label']} (${e['cost_usd']:,.6f})" for e in ends) +
                     f"; prompt tokens from the prefix cache: {cached:,} of {prompt:,} "
                     f"({100 * cached / prompt if prompt else 0:.0f}%)"))
    b = data.get("batches")
    if b:  # --engine openai_batch: the provider's batches as it reported them (pipelines/run/batches.py)
        rows.append(("hosted batches", f"{len(b['batches']):,} batches: {b['submitted']:,} requests submitted, "
                                       f"{b['finished']:,} finished, {b['expired']:,} expired, {b['resubmitted']:,} "
                                       f"resubmitted, {b['failed']:,} failed; billed {b['billed_prompt_tokens']:,} "
                                       f"prompt and {b['billed_completion_tokens']:,} completion tokens"))
    g = data.get("grounded")
    if g and g["values"]:  # the evidence table: values looked for on their page
        rows.append(("values found on their page", f"{g['found']:,} of {g['values']:,} "
                                                    f"({100 * g['found'] / g['values']:.1f}%)"))
    if data.get("engines"):  # the engine service's engines, one per device (the manifest's `engines`)
        rows.append(("engines", engine_line(data["engines"], data.get("wall_seconds"))))
    if t["pages_per_s"]:
        rows.append(("throughput", f"{t['pages_per_s']:.2f} pages/s over {t['wall_seconds']:.1f} s of wall time"))
    return rows


def engine_entries(value: Any) -> list[dict[str, Any]]:
    """Pure: the manifest's `engines` entries of the shape pagemill writes (a manifest lies under its tenant's
    prefix, which the tenant may write: anything else is left out, never a traceback)."""
    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    return [e for e in (value if isinstance(value, list) else []) if isinstance(e, dict)
            and isinstance(e.get("device"), str) and all(whole(e.get(k)) for k in ("pages", "output_tokens", "starts"))
            and (e.get("busy_fraction") is None or isinstance(e.get("busy_fraction"), int | float))]


def engine_line(engines: Sequence[dict[str, Any]], wall_seconds: float | None) -> str:
    """Pure: each engine's pages (and pages/s over the run's wall time), output tokens, busy fraction and starts."""
    def one(e: dict[str, Any]) -> str:
        rate = f" ({e['pages'] / wall_seconds:.2f} pages/s)" if wall_seconds else ""
        busy = "unknown" if e.get("busy_fraction") is None else f"{100 * e['busy_fraction']:.0f}%"
        return (f"device {e['device']}: {e['pages']:,} pages{rate}, {e['output_tokens']:,} output tokens, "
                f"busy {busy}, {e['starts']} start{'s' if e['starts'] != 1 else ''}")

    return "; ".join(one(e) for e in engines)


def render_html(data: dict[str, Any]) -> str:
    template = resources.files("pipelines.tables").joinpath("report_template.html").read_text(encoding="utf-8")
    table = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(data))
    # `<` is escaped as \u003c inside the JSON, so no string in the data can close the <script> element.
    blob = json.dumps(data, default=str, sort_keys=True).replace("<", "\\u003c").replace(">", "\\u003e")
    blob = blob.replace("&", "\\u0026")
    parts = {"<!--TITLE-->": html.escape(f"pagemill run {data['run_id']}"), "<!--SUMMARY-->": table,
             "/*DATA*/null": blob, "'script-hash'": f"'{script_hash(template)}'"}
    # One pass, so that text inserted for one marker is never searched for another.
    return re.sub("|".join(re.escape(k) for k in parts), lambda m: parts[m.group(0)], template)


def script_hash(template: str) -> str:
    """CSP source of the template's one executable script: `sha256-` + base64 of its exact text, so
    the Content-Security-Policy allows that script and no other inline script."""
    scripts = re.findall(r"<script>(.*?)</script>", template, re.S)
    if len(scripts) != 1:
        raise ValueError(f"the report template must hold exactly one inline script, found {len(scripts)}")
    return "sha256-" + base64.b64encode(hashlib.sha256(scripts[0].encode("utf-8")).digest()).decode("ascii")


def command(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="pagemill report", allow_abbrev=False,
                                     description="One self-contained HTML report of a run (no network to open it).")
    parser.add_argument("--output", required=True, help="output root that `pagemill run` wrote")
    parser.add_argument("--run-id", default=None, help="the run (default: the latest)")
    parser.add_argument("--tenant", default=None, help="the tenant whose run it is (default: the run's own)")
    parser.add_argument("--html", required=True, help="the HTML file to write")
    sql.add_catalog_args(parser)
    add_storage_args(parser)
    args = parser.parse_args(argv)
    from schemas.layout import check_identifier

    bad = check_identifier("--run-id", args.run_id) or check_identifier("--tenant", args.tenant)
    if bad:
        print(f"pagemill report: {bad}", file=sys.stderr)
        return 2
    storage = storage_from(vars(args))
    configure(storage)
    try:
        data = collect(args.output, storage, args.run_id, args.tenant, sql.TableSource.from_args(args))
    except (ValueError, duckdb.Error) as err:
        print(f"pagemill report: {err}", file=sys.stderr)
        return 1
    with FileSystems.create(args.html) as handle:  # a local path or any Beam filesystem (s3://)
        handle.write(render_html(data).encode("utf-8"))
    print(f"pagemill report: run {data['run_id']} -> {args.html}")
    return 0
