"""Where each output table's files lie under an output root, and the columns that key its rows; also
where the files beside the tables go (`--write-markdown`'s documents, `eval --save`'s results).

`<output>/<table>/tenant=<tenant>/run_id=<run_id>/part-*.parquet`: hive-partitioned by tenant and run,
so resume, `--force` and compaction touch one (tenant, run id) partition only, and one tenant can never
resume, clear or rewrite another's. Pure path arithmetic on local paths and URIs (s3://, file://);
listing is left to the caller's filesystem (Beam's FileSystems or pyarrow's).
"""
from __future__ import annotations

import re

# One row per key: the SQL views and the compaction at a run's end keep one row per key by one rule
# (schemas/kept_row.py), so a retried or resumed run never shows a row twice.
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "documents": ("tenant", "run_id", "source_uri"),
    "pages": ("tenant", "run_id", "doc_sha256", "page_index"),
    "ledger": ("tenant", "run_id", "doc_sha256", "page_index"),
    "evidence": ("tenant", "run_id", "doc_sha256", "page_index", "field_path"),
}
PART_SUFFIX = ".parquet"
# What Beam's FileSystems.match (and fnmatch) read as a wildcard. The run's files are listed with patterns
# built on the output root, so a root holding one would reach other folders (`out[12]`: out1/ and out2/).
GLOB_CHARS = "*?["


def root_problems(output: str) -> list[str]:
    """Pure: why `output` cannot be an output root (empty: it can). A root is a path, never a pattern."""
    found = sorted({c for c in output if c in GLOB_CHARS})
    if not found:
        return []
    return [f"--output {output!r}: an output root is a path, not a pattern, and may not hold "
            f"{' '.join(found)} (pagemill lists a run's files under it with patterns, which would reach other "
            "folders); rename the folder"]


def join_uri(root: str, *parts: str) -> str:
    """`root/part/...`; an empty root (or `/` alone) gives the parts as a relative path."""
    base = root.rstrip("/")
    return "/".join((base, *parts)) if base else "/".join(parts)


def table_folder(output: str, table: str, tenant: str | None = None) -> str:
    """The folder of one table, or of one tenant's partitions of it."""
    return join_uri(output, table) if tenant is None else join_uri(output, table, f"tenant={tenant}")


def partition(output: str, table: str, tenant: str, run_id: str) -> str:
    """The folder of one run of one tenant in one table (identifiers are validated by the options).
    `*` for the tenant or the run id makes it a glob."""
    return join_uri(output, table, f"tenant={tenant}", f"run_id={run_id}")


def part_glob(output: str, table: str, tenant: str = "*", run_id: str = "*") -> str:
    """The glob of a table's finished part files: of one run, of one tenant, or (`*`) of all."""
    return join_uri(partition(output, table, tenant, run_id), "*" + PART_SUFFIX)


def listing_folder(output: str, tenant: str, run_id: str) -> str:
    """A run's durable listing, written once and read in waves (transforms/store/listing_file.py)."""
    return join_uri(output, "listings", f"tenant={tenant}", f"run_id={run_id}")


def batch_folder(output: str, tenant: str, run_id: str) -> str:
    """A run's hosted batches (`--engine openai_batch`): their state, request, spool and result files
    (transforms/engines/openai_batch/files.py)."""
    return join_uri(output, "batches", f"tenant={tenant}", f"run_id={run_id}")


def markdown_folder(output: str, tenant: str) -> str:
    """`--write-markdown`: one `<doc_sha256>.md` a document, per tenant (a document's file spans runs)."""
    return join_uri(output, "markdown", f"tenant={tenant}")


def manifest_path(output: str, tenant: str, run_id: str) -> str:
    """A run's manifest: `runs/tenant=<tenant>/<run_id>.json`. Under its tenant's folder like the tables, so
    that what may write one tenant's files cannot write a manifest that another tenant's runs read."""
    return join_uri(output, "runs", f"tenant={tenant}", f"{run_id}.json")


def legacy_manifest_path(output: str, run_id: str) -> str:
    """Where manifests were written before they had a tenant folder (`runs/<run_id>.json`): still read,
    but only as the run of the tenant whose partitions hold that run id (pipelines/tables/sql.py manifest_files)."""
    return join_uri(output, "runs", f"{run_id}.json")


def manifest_run_id(path: str) -> str:
    """Pure: the run id a manifest's path names (its file name without `.json`)."""
    return path.rsplit("/", 1)[-1].removesuffix(".json")


def run_id_of(path: str) -> str | None:
    """The run id a part file's path names (its last `run_id=` folder), or None."""
    for part in reversed(path.split("/")):
        if part.startswith("run_id="):
            return part.removeprefix("run_id=")
    return None


def eval_path(output: str, tenant: str, run_id: str) -> str:
    """Where `eval --save` keeps a run's result, and where `pagemill report` looks for it."""
    return join_uri(output, "evals", f"tenant={tenant}", f"run_id={run_id}.json")


def is_part_file(path: str) -> bool:
    """A finished part file: in-progress files (`.inprogress`) and Beam's temporary folders are not."""
    return path.endswith(PART_SUFFIX) and "beam-temp" not in path


def tenant_of(path: str) -> str | None:
    """The tenant a part file's path names (its last `tenant=` folder: the output root may hold one too),
    or None."""
    for part in reversed(path.split("/")):
        if part.startswith("tenant="):
            return part.removeprefix("tenant=")
    return None


# Run ids, tenants and job names become folder names and file names under the output root.
IDENTIFIER = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
IDENTIFIER_RULE = ("letters, digits, '.', '_' and '-' only, not starting with '.', at most 128 characters "
                   "(no path separators)")


def check_identifier(flag: str, value: str | None) -> str | None:
    """A problem line when `value` is not a safe identifier (None when it is, or is unset)."""
    if value is None or IDENTIFIER.fullmatch(value):
        return None
    return f"{flag} {value!r} is not a valid identifier: use {IDENTIFIER_RULE}"
