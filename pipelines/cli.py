"""The `pagemill` command line: run | sql | estimate | eval | report | make-test-model."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SINCE_LAST_RUN_OVERLAP_S = 3600
USAGE = """pagemill run --input URI [--input URI ...] --output DIR [--job FILE] [--run-id ID] [--tenant NAME]
             [pagemill options] [Beam pipeline options]
pagemill sql --output DIR [--tenant T] [--format table|csv|json] "QUERY" | --query NAME | --list-queries
pagemill estimate --input URI [--input URI ...] [--job FILE] [--output DIR] [--format table|json] [run options]
pagemill report --output DIR [--tenant T] [--run-id ID] --html FILE
pagemill eval --output DIR [--run-id ID] [--tenant T] --truth FILE [--format table|json] [--save]
pagemill presets
pagemill make-test-model DIR [--family qwen2_vl|qwen2_5_vl|llava_next|internvl|idefics3] [--seed N]"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "run":
        return run_command(rest)
    if command == "sql":
        return sql_command(rest)
    if command == "make-test-model":
        return make_test_model_command(rest)
    if command == "presets":
        from transforms.presets import listing

        print(listing())
        return 0
    if command == "eval":
        return eval_command(rest)
    if command in ("estimate", "report"):
        return estimate_command(rest) if command == "estimate" else report_command(rest)
    print(f"pagemill: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


def run_command(argv: Sequence[str]) -> int:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    from pipelines.exit_codes import exit_code
    from pipelines.graph import build_pipeline
    from pipelines.manifest import build_manifest, run_counts, write_manifest
    from pipelines.option_checks import check_options
    from pipelines.options import (
        OptionError,
        PagemillOptions,
        check_identifiers,
        local_workers_flags,
        merge_flags,
        new_run_id,
    )
    from pipelines.preflight import preflight
    from pipelines.storage import add_storage_args, configure, storage_from
    from transforms.presets import with_preset
    from transforms.write import clear_run, compact_run, run_files

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--job", default=None)
    add_storage_args(pre)
    if "-h" in argv or "--help" in argv:
        helper = argparse.ArgumentParser(prog="pagemill run", parents=[pre], epilog="and Beam's pipeline options")
        PagemillOptions._add_argparse_args(helper)
        helper.print_help()
        return 0
    known, rest = pre.parse_known_args(argv)
    try:
        flags = merge_flags(rest, known.job)
    except OptionError as err:
        for problem in err.problems:
            print(f"pagemill run: {problem}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as err:
        print(f"pagemill: cannot read job file {known.job}: {err}", file=sys.stderr)
        return 2
    try:
        flags = with_preset(flags)  # the preset's flags first: every flag given explicitly wins
    except ValueError as err:
        print(f"pagemill run: --preset: {err}", file=sys.stderr)
        return 2
    from_job, flags = pre.parse_known_args(flags)  # storage keys of a job file; the command line wins
    given = {k: v for k, v in vars(from_job).items() if v and k != "job"}
    given.update({k: v for k, v in vars(known).items() if v})
    storage = storage_from({**PagemillOptions(flags).get_all_options(), **given})
    # Every core by default: a local run's CPU stages in one worker process a core (`--workers`).
    options = PagemillOptions(flags + storage.beam_flags() + local_workers_flags(flags, usable_cores()))
    o = options.view_as(PagemillOptions)
    if not o.input or not o.output:
        print("pagemill run: --input and --output are required (or a --job file that sets them)", file=sys.stderr)
        return 2
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
    earlier_files = [] if o.force else page_files(o.output, o.tenant)
    started = dt.datetime.now(dt.UTC)
    run = {"run_id": o.run_id, "tenant": o.tenant, "created_at": started}
    verb = "resuming" if resumed else "reading"
    print(f"pagemill: run {o.run_id}: {verb} {', '.join(o.input)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, o, run, earlier_files, done_files, since, until)
    try:
        result = pipeline.run()
        result.wait_until_finish()
    except Exception as err:  # noqa: BLE001 - one clear line; the runner has logged the traceback
        from transforms.write import run_failure

        # Not finished: no manifest (a `--since-last-run` nightly must not start after this run), and
        # the rows written so far stay for the resume.
        print(f"pagemill: run {o.run_id} failed: {run_failure(err)}; the rows written so far are kept: "
              f"fix the cause and run the same command with --run-id {o.run_id} to resume", file=sys.stderr)
        return 1
    if resumed:
        compact_run(o.output, o.tenant, o.run_id)
    wall = time.perf_counter() - t0
    counts = run_counts(o.output, o.run_id, storage, o.tenant)
    manifest = build_manifest(o.run_id, _public_options(options), counts, stage_metrics(result),
                              started, dt.datetime.now(dt.UTC))
    code, why = exit_code(counts, o.max_failed_fraction)  # rows are written: now judge them
    manifest.update(resumed=resumed, exit_code=code, exit_reason=why)
    uri = write_manifest(o.output, o.run_id, manifest)
    print(summary(counts, wall, o.output, uri))
    if o.write_markdown:
        from pipelines.markdown_files import write_markdown

        written = write_markdown(o.output, o.tenant, o.run_id, storage)
        print(f"  markdown: {written} documents under {o.output.rstrip('/')}/markdown/tenant={o.tenant}/")
    for error in counts["errors"]:
        print(f"pagemill run: error: {error}", file=sys.stderr)
    print(f"pagemill: exit {code}: {why}", file=sys.stderr if code else sys.stdout)
    return code


def usable_cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's CPU set), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_id_taken(output: str, tenant: str, run_id: str) -> list[str]:
    """A run id belongs to the tenant that first wrote it: another tenant neither resumes, clears nor
    overwrites its manifest (the manifest is `runs/<run_id>.json`, one per run id)."""
    from pipelines.manifest import manifest_tenant
    from transforms.write import run_tenants

    owners = run_tenants(output, run_id) | ({manifest_tenant(output, run_id)} - {None})
    if owners - {tenant}:  # the owner is not named: one tenant learns nothing about another
        return [f"--run-id {run_id!r} belongs to another tenant under {output}; choose another run id"]
    return []


def page_files(output: str, tenant: str) -> list[str]:
    """This tenant's finished `pages` files under the output root: the result cache's source."""
    from apache_beam.io.filesystems import FileSystems

    from transforms.write import join_uri, partition

    pattern = join_uri(partition(output, "pages", tenant, "*"), "*.parquet")
    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception:  # noqa: BLE001 - no output yet
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


def _public_options(options: Any) -> dict[str, Any]:
    from pipelines.storage import SECRET_OPTIONS  # credentials never reach the manifest

    return {k: v for k, v in options.get_all_options(drop_default=False).items() if k not in SECRET_OPTIONS}


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


def sql_command(argv: Sequence[str]) -> int:
    from pipelines import sql
    from pipelines.storage import add_storage_args, configure, storage_from

    parser = argparse.ArgumentParser(prog="pagemill sql")
    parser.add_argument("--output", default=None, help="output root that `pagemill run` wrote")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")
    parser.add_argument("--query", dest="named", metavar="NAME", default=None, help="a named query (--list-queries)")
    parser.add_argument("--list-queries", action="store_true", help="list the named queries")
    parser.add_argument("--tenant", default=None, help="every view holds this tenant's rows only")
    parser.add_argument("query", nargs="?", help="SQL over the views documents, pages, ledger and runs")
    add_storage_args(parser)
    args = parser.parse_args(argv)
    if args.list_queries:
        from pipelines.queries import listing

        print(listing())
        return 0
    if not args.output or (args.query is None) == (args.named is None):
        parser.error("--output and exactly one of QUERY or --query NAME are required")
    from pipelines.options import check_identifier

    bad = check_identifier("--tenant", args.tenant)
    if bad:
        print(f"pagemill sql: {bad}", file=sys.stderr)
        return 2
    storage = storage_from(vars(args))
    configure(storage)
    try:
        if args.named:
            from pipelines import queries

            columns, rows = queries.run(args.output, args.named, storage, tenant=args.tenant)
        else:
            columns, rows = sql.query(args.output, args.query, storage, tenant=args.tenant)
    except Exception as err:  # noqa: BLE001 - DuckDB's message is the useful part
        print(f"pagemill sql: {sql.error_line(err)}", file=sys.stderr)
        return 1
    print(sql.render(columns, rows, args.format))
    return 0


def estimate_command(argv: Sequence[str]) -> int:
    from pipelines.estimate_cli import command

    return command(argv)


def eval_command(argv: Sequence[str]) -> int:
    from pipelines.eval import command

    return command(argv)


def report_command(argv: Sequence[str]) -> int:
    from pipelines.report import command

    return command(argv)


def make_test_model_command(argv: Sequence[str]) -> int:
    from pipelines.test_model import FAMILIES, make_test_model

    parser = argparse.ArgumentParser(prog="pagemill make-test-model")
    parser.add_argument("dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", default="qwen2_vl", choices=FAMILIES)
    args = parser.parse_args(argv)
    path = make_test_model(Path(args.dir), seed=args.seed, family=args.family)
    print(json.dumps({"model": str(path)}))
    return 0


class _QuietImports(logging.Filter):
    """Beam warns about Google Cloud clients that a pagemill install does not use."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "apitools not found" not in record.getMessage()


def entry() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_QuietImports())
    sys.exit(main())


if __name__ == "__main__":
    entry()
