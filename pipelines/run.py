"""One run, after its command line is parsed (pipelines/cli.py): checks and pre-flight, the run id, the
listing window, resume or --force, the pipeline, compaction, the manifest, the summary and the exit code."""
from __future__ import annotations

import datetime as dt
import sys
import time
from typing import Any

from schemas import layout

SINCE_LAST_RUN_OVERLAP_S = 3600


def run(options: Any, storage: Any) -> int:
    """Run the pipeline `options` describe (PipelineOptions holding PagemillOptions) over `storage`
    (pipelines/storage.py); the exit code (pipelines/exit_codes.py), 2 when an option or check fails."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    from pipelines import graph  # looked up at call time: tests put a failing builder there
    from pipelines.exit_codes import exit_code
    from pipelines.manifest import build_manifest, manifest_options, run_counts, write_manifest
    from pipelines.option_checks import check_options
    from pipelines.options import PagemillOptions, check_identifiers, new_run_id
    from pipelines.preflight import preflight
    from pipelines.settings import run_settings
    from pipelines.storage import configure
    from transforms.output.run_root import clear_run, compact_run, run_files, tenant_files

    o = options.view_as(PagemillOptions)
    job_name = options.view_as(GoogleCloudOptions).job_name
    # Identifiers become paths under the output root: checked before anything (even pre-flight) runs.
    problems = check_identifiers(o, job_name)
    if not problems:
        configure(storage)
        problems = check_options(o) or preflight(o.input, o.output, storage)  # nothing is written if options are bad
    o.run_id = o.run_id or new_run_id()
    problems = problems or run_id_taken(o.output, o.tenant, o.run_id)
    if problems:
        for problem in problems:
            print(f"pagemill run: {problem}", file=sys.stderr)
        return 2
    since, until = listing_window(o, job_name, storage)
    if o.force:
        clear_run(o.output, o.tenant, o.run_id)
    done_files = run_files(o.output, "documents", o.tenant, o.run_id)
    resumed = bool(done_files or run_files(o.output, "pages", o.tenant, o.run_id))
    earlier_files = [] if o.force else tenant_files(o.output, "pages", o.tenant)  # the result cache's source
    started = dt.datetime.now(dt.UTC)
    run = {"run_id": o.run_id, "tenant": o.tenant, "created_at": started}
    verb = "resuming" if resumed else "reading"
    print(f"pagemill: run {o.run_id}: {verb} {', '.join(o.input)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    pipeline = beam.Pipeline(options=options)
    graph.build_pipeline(pipeline, run_settings(o), run, earlier_files, done_files, since, until)
    try:
        result = pipeline.run()
        result.wait_until_finish()
    except Exception as err:  # noqa: BLE001 - one clear line; the runner has logged the traceback
        from transforms.output.run_root import run_failure

        # Not finished: no manifest (a `--since-last-run` nightly must not start after this run), and
        # the rows written so far stay for the resume.
        print(f"pagemill: run {o.run_id} failed: {run_failure(err)}; the rows written so far are kept: "
              f"fix the cause and run the same command with --run-id {o.run_id} to resume", file=sys.stderr)
        return 1
    if resumed:
        compact_run(o.output, o.tenant, o.run_id)
    wall = time.perf_counter() - t0
    counts = run_counts(o.output, o.run_id, storage, o.tenant)
    manifest = build_manifest(o.run_id, manifest_options(options), counts, stage_metrics(result),
                              started, dt.datetime.now(dt.UTC))
    code, why = exit_code(counts, o.max_failed_fraction)  # rows are written: now judge them
    manifest.update(resumed=resumed, exit_code=code, exit_reason=why)
    uri = write_manifest(o.output, o.run_id, manifest)
    print(summary(counts, wall, o.output, uri))
    if o.write_markdown:
        from pipelines.markdown_files import write_markdown

        written = write_markdown(o.output, o.tenant, o.run_id, storage)
        print(f"  markdown: {written} documents under {layout.markdown_folder(o.output, o.tenant)}/")
    for error in counts["errors"]:
        print(f"pagemill run: error: {error}", file=sys.stderr)
    print(f"pagemill: exit {code}: {why}", file=sys.stderr if code else sys.stdout)
    return code


def run_id_taken(output: str, tenant: str, run_id: str) -> list[str]:
    """A run id belongs to the tenant that first wrote it: another tenant neither resumes, clears nor
    overwrites its manifest (the manifest is `runs/<run_id>.json`, one per run id)."""
    from pipelines.manifest import manifest_tenant
    from transforms.output.run_root import run_tenants

    owners = run_tenants(output, run_id) | ({manifest_tenant(output, run_id)} - {None})
    if owners - {tenant}:  # the owner is not named: one tenant learns nothing about another
        return [f"--run-id {run_id!r} belongs to another tenant under {output}; choose another run id"]
    return []


def listing_window(o: Any, job_name: str | None, storage: Any) -> tuple[float | None, float | None]:
    """--modified-since/--modified-until, or --since-last-run: the start of the last finished run
    of this job name and tenant (objects modified after its listing began)."""
    from pipelines.option_checks import epoch

    since = epoch(o.modified_since)
    until = epoch(o.modified_until)
    if o.since_last_run:
        from pipelines import sql

        query = ("SELECT max(started_at) FROM runs WHERE tenant = ? AND "
                 "coalesce(json_extract_string(manifest, '$.options.job_name'), '') = ?")
        con = sql.connect(o.output, storage)
        try:
            (last,) = con.execute(query, [o.tenant, job_name or ""]).fetchone()
        finally:
            con.close()
        if last:
            # An overlap, because an object can arrive with an older LastModified (a copy that keeps
            # times, a multipart upload begun before the last run, clock skew); the cache makes
            # listing it again cost nothing.
            start = dt.datetime.fromisoformat(last).timestamp() - SINCE_LAST_RUN_OVERLAP_S
            since = max(since or 0.0, start)
    return since, until


def stage_metrics(result: Any) -> dict[str, Any]:
    """Counters and time distributions from Beam's metrics (every runner reports them)."""
    out: dict[str, Any] = {}
    try:
        queried = result.metrics().query()
    except Exception:  # noqa: BLE001 - some runners cannot report metrics; the manifest says so
        return {"unavailable": True}
    for counter in queried.get("counters", []):
        out[counter.key.metric.name] = out.get(counter.key.metric.name, 0) + counter.committed
    for dist in queried.get("distributions", []):
        d = dist.committed
        if d is not None and d.count:
            out[dist.key.metric.name] = {"count": d.count, "sum": d.sum, "mean": round(d.sum / d.count, 3),
                                         "max": d.max}
    return out


def summary(counts: dict[str, Any], wall: float, output: str, manifest_uri: str) -> str:
    pages = counts["totals"]["pages"]
    lines = [f"pagemill: {counts['documents']} documents, {pages} pages in {wall:.1f} s "
             f"({pages / max(wall, 1e-9):.2f} pages/s)"]
    lines.append("  outcomes: " + ", ".join(f"{k} {v}" for k, v in counts["outcomes"].items()))
    if counts["reject_reasons"]:
        lines.append("  reasons:  " + ", ".join(f"{k} {v}" for k, v in counts["reject_reasons"].items()))
    if counts["pages"]:
        lines.append("  pages:    " + ", ".join(f"{k} {v}" for k, v in counts["pages"].items()))
    t = counts["totals"]
    lines.append(f"  model calls {t['model_calls']}, tokens in {t['image_tokens'] + t['text_tokens']}, "
                 f"out {t['output_tokens']}, cost ${t['cost_usd']:.6f} (hosted API ${t['api_equivalent_usd']:.6f})")
    if counts.get("errors"):
        lines.append(f"  ERRORS:   {len(counts['errors'])} (the run's tables break an invariant; see below)")
    lines.append(f"  tables:   {output.rstrip('/')}/{{documents,pages,ledger}}/tenant={counts.get('tenant')}/  "
                 f"manifest: {manifest_uri}")
    lines.append(f"  query:    pagemill sql --output {output} \"SELECT outcome, count(*) FROM documents GROUP BY 1\"")
    return "\n".join(lines)
