"""The `pagemill` command line: run | sql | estimate | eval | bench | report | cancel | make-test-model."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

USAGE = """pagemill run --input URI [--input URI ...] --output DIR [--job FILE] [--run-id ID] [--tenant NAME]
             [pagemill options] [Beam pipeline options]
pagemill sql --output DIR [--tenant T] [--format table|csv|json] "QUERY" | --query NAME | --list-queries
pagemill export --output DIR --schema VIEW --to FILE [--format parquet|csv] [--tenant T]
pagemill estimate --input URI [--input URI ...] [--job FILE] [--output DIR] [--format table|json] [run options]
pagemill report --output DIR [--tenant T] [--run-id ID] --html FILE
pagemill eval --output DIR [--run-id ID] [--tenant T] --truth FILE [--format table|json] [--save]
pagemill eval --bench olmocr-bench|sroie|cord --data DIR --output DIR [--run-id ID] [--format table|json]
pagemill bench olmocr-bench|sroie|cord --data DIR --output DIR [--preset P] [--run-id ID] [run options]
pagemill cancel --output DIR --run-id ID --endpoint URL [--tenant T] [--api-key-env VAR] [--engine E]
pagemill expire --output DIR --catalog URI [--older-than-days N] [--dry-run]
pagemill presets
pagemill make-test-model DIR [--family qwen2_vl|qwen2_5_vl|llava_next|internvl|idefics3] [--seed N]"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    from pipelines.config.storage import secrets_warning

    warning = secrets_warning(rest)
    if warning:
        print(warning, file=sys.stderr)
    handler = COMMANDS.get(command)
    if handler is None:
        print(f"pagemill: unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    return handler(rest)


def export_command(argv: Sequence[str]) -> int:
    from pipelines.tables.export import command

    return command(argv)


def cancel_command(argv: Sequence[str]) -> int:
    from pipelines.run.batches import cancel_command as cancel

    return cancel(argv)


def expire_command(argv: Sequence[str]) -> int:
    from pipelines.tables.expire import command

    return command(argv)


def presets_command(argv: Sequence[str]) -> int:
    from pipelines.config.presets import listing

    print(listing())
    return 0


def bench_command(argv: Sequence[str]) -> int:
    from pipelines.bench.command import bench_command as bench

    return bench(argv, run_command)


def run_command(argv: Sequence[str]) -> int:
    """Parse the run's flags (command line, --job file, --preset, storage) and hand them to pipelines/run/run.py."""
    from pipelines.config.options import OptionError, PagemillOptions, merge_flags
    from pipelines.config.presets import with_preset
    from pipelines.config.storage import add_storage_args, storage_from
    from pipelines.run.local_workers import local_workers_flags, usable_cores

    argv = ["--verbose" if a == "-v" else a for a in argv]  # the short spelling of --verbose
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
    from pipelines.run.run import run

    return run(options, storage)


def sql_command(argv: Sequence[str]) -> int:
    # No Beam here: `pagemill sql` reads through pyarrow's filesystems, and Beam's import alone costs ~1 s.
    from pipelines.config.storage import add_storage_args, storage_from
    from pipelines.tables import sql

    parser = argparse.ArgumentParser(prog="pagemill sql")
    parser.add_argument("--output", default=None, help="output root that `pagemill run` wrote")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table")
    parser.add_argument("--query", dest="named", metavar="NAME", default=None, help="a named query (--list-queries)")
    parser.add_argument("--list-queries", action="store_true", help="list the named queries")
    parser.add_argument("--tenant", default=None, help="every view holds this tenant's rows only")
    parser.add_argument("query", nargs="?", help="SQL over the views documents, pages, ledger and runs")
    sql.add_catalog_args(parser)
    add_storage_args(parser)
    args = parser.parse_args(argv)
    if args.list_queries:
        from pipelines.tables.queries import listing

        print(listing())
        return 0
    if not args.output or (args.query is None) == (args.named is None):
        parser.error("--output and exactly one of QUERY or --query NAME are required")
    from schemas.layout import check_identifier

    bad = check_identifier("--tenant", args.tenant)
    if bad:
        print(f"pagemill sql: {bad}", file=sys.stderr)
        return 2
    storage = storage_from(vars(args))
    try:
        source = sql.TableSource.from_args(args)
        if args.named:
            from pipelines.tables import queries

            columns, rows = queries.run(args.output, args.named, storage, tenant=args.tenant, source=source)
        else:
            columns, rows = sql.query(args.output, args.query, storage, tenant=args.tenant, source=source)
    except sql.CatalogRefused as err:  # a catalog that names a class to run, a table not pagemill's
        print(f"pagemill sql: --catalog: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - DuckDB's message is the useful part
        print(f"pagemill sql: {sql.error_line(err)}", file=sys.stderr)
        return 1
    print(sql.render(columns, rows, args.format))
    return 0


def estimate_command(argv: Sequence[str]) -> int:
    from pipelines.estimate.command import command

    return command(argv)


def eval_command(argv: Sequence[str]) -> int:
    if any(a == "--bench" or a.startswith("--bench=") for a in argv):  # a public benchmark's own truth and metric
        from pipelines.bench.command import eval_command as bench_eval

        return bench_eval(argv)
    from pipelines.tables.eval import command

    return command(argv)


def report_command(argv: Sequence[str]) -> int:
    from pipelines.tables.report import command

    return command(argv)


def make_test_model_command(argv: Sequence[str]) -> int:
    from pipelines.tiny_models import FAMILIES, make_test_model

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



# The commands, one entry each: a name and its handler (each imports its room only when called).
COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "run": run_command, "sql": sql_command, "export": export_command, "estimate": estimate_command,
    "eval": eval_command, "bench": bench_command, "report": report_command, "cancel": cancel_command,
    "expire": expire_command, "presets": presets_command, "make-test-model": make_test_model_command}

def entry() -> None:
    from transforms.child_process import keep_cwd_off_python_paths

    keep_cwd_off_python_paths(os.environ)  # Beam's worker processes start as `python -m`: not from the cwd
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_QuietImports())
    leave(main())


EXIT_GRACE_S = 10.0


def leave(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """Exit with `code`. A runner thread that outlived its job (the embedded job service's, once a lost worker
    pool's job was cancelled: pipelines/run/pool_watch.py) would hold the interpreter's exit forever; the
    launcher gives such threads `grace_s`, then leaves without them (everything it writes is written)."""
    deadline = time.monotonic() + grace_s
    for thread in _outliving():
        thread.join(max(0.0, deadline - time.monotonic()))
    left = _outliving()
    if left:
        print(f"pagemill: leaving {len(left)} runner thread(s) that did not end ({', '.join(t.name for t in left)})",
              file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _outliving() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not threading.main_thread()]


if __name__ == "__main__":
    entry()
