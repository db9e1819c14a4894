"""Named analyst queries: `pagemill sql --query NAME` (`--list-queries` lists them).

Each query is plain DuckDB SQL over the views of `pipelines.tables.sql.connect` (`documents`, `pages`, `ledger`:
the latest row per key; `runs`: one row per manifest; the typed views `invoice`, `receipt`, ... and
`typed_unfit`, `typed_columns`: pipelines/tables/typed_views.py) plus `reason_codes` (code, meaning), registered
here. Extracted values are read from the typed views, never parsed out of `pages.extraction` by hand. Each
takes one optional parameter, `$run_id`: NULL means every run under the output root. Every query groups
and joins on tenant (and run id where it reports per run), so tenants never mix in one row even when a run
id repeats; `pagemill sql --tenant T --query NAME` runs it over one tenant's rows only.
Money is what the ledger recorded: `cost_usd` (GPU-seconds at --gpu-hourly-usd) and `api_equivalent_usd`
(the same page at a hosted API's list price).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from pipelines.config.storage import StorageConfig
from pipelines.tables import sql
from schemas.reasons import REASON_CODES
from schemas.records import model_routes_sql
from schemas.statuses import DUPLICATE, OK

MODEL_L = model_routes_sql("l.route")  # pages sent to a model: in-process, served or a hosted API


@dataclass(frozen=True)
class NamedQuery:
    name: str
    description: str
    sql: str


COST_BY_RUN = NamedQuery("cost-by-run", "Pages, tokens, GPU-seconds and dollars of each run, per 1,000 pages, "
                         "beside the hosted-API price of the same pages.", f"""
SELECT l.tenant, l.run_id,
       any_value(r.started_at) AS started_at,
       count(*) AS pages,
       count(*) FILTER (WHERE {MODEL_L}) AS model_pages,
       count(*) FILTER (WHERE l.route IN ('duplicate', 'cache')) AS reused_pages,
       sum(l.image_tokens) AS image_tokens,
       sum(l.text_tokens) AS text_tokens,
       sum(l.output_tokens) AS output_tokens,
       round(sum(l.gpu_seconds), 3) AS gpu_seconds,
       round(sum(l.cost_usd), 6) AS cost_usd,
       round(1000 * sum(l.cost_usd) / count(*), 6) AS usd_per_1k_pages,
       round(sum(l.api_equivalent_usd), 6) AS api_equivalent_usd,
       round(sum(l.api_equivalent_usd) / nullif(sum(l.cost_usd), 0), 1) AS api_over_cost
FROM ledger l LEFT JOIN runs r USING (tenant, run_id)
WHERE $run_id IS NULL OR l.run_id = $run_id
GROUP BY l.tenant, l.run_id
ORDER BY min(l.created_at), l.tenant, l.run_id""")

REJECT_REASONS = NamedQuery("reject-reasons", "Every reason code by run: documents (rejected, failed, partial) and "
                            "pages, with a count, an example and what the code means.", """
WITH reasons AS (
  SELECT tenant, run_id, 'document' AS level, outcome AS status, reason_code, source_uri AS example
  FROM documents WHERE reason_code IS NOT NULL
  UNION ALL
  SELECT tenant, run_id, 'page', status, reason_code, source_uri || '#page=' || (page_index + 1)
  FROM pages WHERE reason_code IS NOT NULL
)
SELECT tenant, run_id, level, status, reason_code, count(*) AS n, min(example) AS example,
       any_value(c.meaning) AS meaning
FROM reasons LEFT JOIN reason_codes c ON c.code = reasons.reason_code
WHERE $run_id IS NULL OR run_id = $run_id
GROUP BY tenant, run_id, level, status, reason_code
ORDER BY tenant, run_id, level, n DESC, reason_code, status""")

# Pages that cost nothing because an identical page was extracted once: `duplicate` ledger rows (same
# cache key inside the run), `cache` rows (answered by an earlier run) and the pages of `duplicate`
# documents (byte-identical copies never reach the page stage, so they have no ledger row: their pages
# come from documents.page_count, priced with the run's schema and model). Each is priced at what a
# model page of the same run, schema and model cost on average; a run with no model page (everything
# cached) is priced at the average over every run of that tenant, schema and model (`priced_from` says which).
CACHE_SAVINGS = NamedQuery("cache-savings", "Money saved by dedup and the result cache: pages answered without a "
                           "model call, priced at the average model page of the same run, schema and model.", f"""
WITH model_pages AS (
  SELECT l.tenant, l.run_id, p.schema_id, p.model, l.cost_usd, l.api_equivalent_usd
  FROM ledger l JOIN pages p USING (tenant, run_id, doc_sha256, page_index)
  WHERE {MODEL_L}
), per_run AS (
  SELECT tenant, run_id, schema_id, model, avg(cost_usd) AS usd, avg(api_equivalent_usd) AS api_usd
  FROM model_pages GROUP BY ALL
), per_schema AS (
  SELECT tenant, schema_id, model, avg(cost_usd) AS usd, avg(api_equivalent_usd) AS api_usd
  FROM model_pages GROUP BY ALL
), run_config AS (
  SELECT tenant, run_id, any_value(schema_id) AS schema_id, any_value(model) AS model
  FROM pages WHERE schema_id IS NOT NULL GROUP BY tenant, run_id
), reused AS (
  SELECT l.tenant, l.run_id, p.schema_id, p.model, l.route, count(*) AS pages
  FROM ledger l JOIN pages p USING (tenant, run_id, doc_sha256, page_index)
  WHERE l.route IN ('duplicate', 'cache') GROUP BY ALL
  UNION ALL
  SELECT d.tenant, d.run_id, c.schema_id, c.model, 'duplicate_document', sum(d.page_count)
  FROM documents d JOIN run_config c USING (tenant, run_id)
  WHERE d.outcome = '{DUPLICATE}' GROUP BY ALL
), saved AS (
  SELECT tenant, run_id, schema_id, model,
         coalesce(sum(pages) FILTER (WHERE route = 'duplicate'), 0) AS duplicate_pages,
         coalesce(sum(pages) FILTER (WHERE route = 'duplicate_document'), 0) AS duplicate_document_pages,
         coalesce(sum(pages) FILTER (WHERE route = 'cache'), 0) AS cached_pages,
         sum(pages) AS pages_saved
  FROM reused GROUP BY ALL
)
SELECT s.tenant, s.run_id, s.schema_id, s.model, s.duplicate_pages, s.duplicate_document_pages, s.cached_pages,
       s.pages_saved,
       CASE WHEN r.usd IS NOT NULL THEN 'this run' WHEN a.usd IS NOT NULL THEN 'all runs' END AS priced_from,
       round(coalesce(r.usd, a.usd), 8) AS usd_per_model_page,
       round(s.pages_saved * coalesce(r.usd, a.usd), 6) AS saved_usd,
       round(s.pages_saved * coalesce(r.api_usd, a.api_usd), 6) AS saved_api_usd
FROM saved s
LEFT JOIN per_run r USING (tenant, run_id, schema_id, model)
LEFT JOIN per_schema a USING (tenant, schema_id, model)
WHERE $run_id IS NULL OR s.run_id = $run_id
ORDER BY s.tenant, s.run_id, s.schema_id, s.model""")

TOKENS_BY_SCHEMA = NamedQuery("tokens-by-schema", "Tokens a model page takes per schema and model: means, output "
                              "p95 and max, attempts, and the share of pages extracted ok.", f"""
SELECT p.tenant, p.schema_id, p.model,
       count(DISTINCT l.run_id) AS runs,
       count(*) AS model_pages,
       round(avg(l.image_tokens), 1) AS image_per_page,
       round(avg(l.text_tokens), 1) AS text_per_page,
       round(avg(l.output_tokens), 1) AS output_per_page,
       quantile_disc(l.output_tokens, 0.95) AS output_p95,
       max(l.output_tokens) AS output_max,
       sum(l.image_tokens + l.text_tokens + l.output_tokens) AS total_tokens,
       round(avg(l.attempts), 2) AS attempts_per_page,
       round(count(*) FILTER (WHERE p.status = '{OK}') / count(*), 3) AS ok_share
FROM ledger l JOIN pages p USING (tenant, run_id, doc_sha256, page_index)
WHERE {MODEL_L} AND ($run_id IS NULL OR l.run_id = $run_id)
GROUP BY p.tenant, p.schema_id, p.model
ORDER BY total_tokens DESC, p.tenant, p.schema_id""")

# "Slowest" is engine time: each page's gpu_seconds is its batch's engine wall time shared out by tokens.
# Render time is not recorded per document (the manifest has its distribution over the whole run).
SLOWEST_DOCUMENTS = NamedQuery("slowest-documents", "The 20 documents that took the most engine time "
                               "(GPU-seconds), with pages, attempts, tokens, cost and outcome.", f"""
SELECT l.tenant, l.run_id, l.source_uri,
       any_value(d.outcome) AS outcome,
       count(*) AS pages,
       count(*) FILTER (WHERE {MODEL_L}) AS model_pages,
       round(sum(l.gpu_seconds), 3) AS gpu_seconds,
       round(sum(l.gpu_seconds) / nullif(count(*) FILTER (WHERE {MODEL_L}), 0), 3) AS seconds_per_model_page,
       sum(l.attempts) AS attempts,
       sum(l.image_tokens + l.text_tokens + l.output_tokens) AS tokens,
       round(sum(l.cost_usd), 6) AS cost_usd
FROM ledger l LEFT JOIN documents d USING (tenant, run_id, source_uri)
WHERE $run_id IS NULL OR l.run_id = $run_id
GROUP BY l.tenant, l.run_id, l.source_uri
ORDER BY gpu_seconds DESC, l.source_uri, l.tenant
LIMIT 20""")

# Spend from the typed views of the shipped invoice and receipt schemas, one row per page: a page extracted
# again by a later run (--force, another model) counts once, with its latest answer; a NULL total (not on
# the page, or a value that did not fit) adds nothing and is counted apart.
SPEND_BY_VENDOR = NamedQuery("spend-by-vendor", "Invoiced and receipted totals per vendor and currency, from the "
                             "typed views invoice and receipt: pages, documents, total, dates, unfit values.", """
WITH spend AS (
  SELECT tenant, run_id, doc_sha256, page_index, extracted_at, 'invoice' AS kind, vendor_name AS vendor, currency,
         total, issue_date AS date, unfit_values
  FROM invoice
  UNION ALL
  SELECT tenant, run_id, doc_sha256, page_index, extracted_at, 'receipt', merchant, currency, total, date, unfit_values
  FROM receipt
), latest AS (
  SELECT * FROM spend WHERE $run_id IS NULL OR run_id = $run_id
  QUALIFY row_number() OVER (PARTITION BY tenant, kind, doc_sha256, page_index
                             ORDER BY extracted_at DESC NULLS LAST, run_id DESC) = 1
)
SELECT tenant, kind, vendor, currency,
       count(*) AS pages,
       count(DISTINCT doc_sha256) AS documents,
       round(sum(total), 2) AS total,
       count(*) FILTER (WHERE total IS NULL) AS pages_without_total,
       min(date) AS first_date,
       max(date) AS last_date,
       count(*) FILTER (WHERE unfit_values > 0) AS pages_with_unfit_values
FROM latest
GROUP BY tenant, kind, vendor, currency
ORDER BY tenant, total DESC NULLS LAST, kind, vendor NULLS LAST, currency NULLS LAST""")

UNFIT_VALUES = NamedQuery("unfit-values", "Extracted values that did not fit their column's SQL type (NULL in the "
                          "typed view): per run, view and column, with a count, an example page and the type.", """
SELECT u.tenant, u.run_id, u.view, u."column",
       count(*) AS pages,
       min(u.source_uri || '#page=' || (u.page_index + 1)) AS example,
       coalesce(any_value(c.type), 'a JSON object') AS expected
FROM typed_unfit u LEFT JOIN typed_columns c ON c.view = u.view AND c."column" = u."column"
WHERE $run_id IS NULL OR u.run_id = $run_id
GROUP BY u.tenant, u.run_id, u.view, u."column"
ORDER BY u.tenant, u.run_id, pages DESC, u.view, 4""")

ANSWER_ENDS = NamedQuery("answer-ends", "Why the model's answers ended (stop, length, repetition, deadline) per run: "
                         "pages, output tokens, GPU-seconds and dollars of each and their share of the run's model "
                         "cost, and the prompt tokens the engine's prefix cache held.", f"""
SELECT l.tenant, l.run_id, coalesce(l.stop_reason, 'unknown') AS stop_reason,
       count(*) AS pages,
       sum(l.output_tokens) AS output_tokens,
       round(sum(l.gpu_seconds), 3) AS gpu_seconds,
       round(sum(l.cost_usd), 6) AS cost_usd,
       round(sum(l.cost_usd) / nullif(sum(sum(l.cost_usd)) OVER (PARTITION BY l.tenant, l.run_id), 0), 4)
           AS cost_share,
       sum(l.image_tokens + l.text_tokens) AS prompt_tokens,
       sum(coalesce(l.cached_prompt_tokens, 0)) AS cached_prompt_tokens,
       round(sum(coalesce(l.cached_prompt_tokens, 0)) / nullif(sum(l.image_tokens + l.text_tokens), 0), 4)
           AS cached_share
FROM ledger l
WHERE {MODEL_L} AND ($run_id IS NULL OR l.run_id = $run_id)
GROUP BY l.tenant, l.run_id, 3
ORDER BY l.tenant, l.run_id, cost_usd DESC, stop_reason""")

# The `evidence` table (transforms/model/evidence.py): values the page's words do not show (not made-up for sure:
# an OCR misread or a value the model computed, like a sum, lands here too; `score` says how near the best match was).
UNGROUNDED_VALUES = NamedQuery("ungrounded-values", "Extracted values not found on their page: the page, the field "
                               "path, the value, where it was looked for (text layer or OCR) and the best match's "
                               "score.", """
SELECT e.tenant, e.run_id, e.source_uri || '#page=' || (e.page_index + 1) AS page, e.schema_id, e.field_path,
       e.value, e.method, e.score
FROM evidence e
WHERE e.grounded = false AND ($run_id IS NULL OR e.run_id = $run_id)
ORDER BY e.tenant, e.run_id, e.source_uri, e.page_index, e.field_path""")

# The grounded share per field: a line item's fields counted together (`line_items[].amount`).
GROUNDED_BY_FIELD = NamedQuery("grounded-by-field", "Per run, schema and field: how many values were looked for on "
                               "their page, the share found there, and the mean score of those found.", """
SELECT e.tenant, e.run_id, e.schema_id, regexp_replace(e.field_path, '\\[[0-9]+\\]', '[]', 'g') AS field,
       count(*) AS values_checked, count(*) FILTER (WHERE e.grounded) AS values_grounded,
       round(avg(CASE WHEN e.grounded THEN 1.0 ELSE 0.0 END), 4) AS grounded_share,
       round(avg(e.score) FILTER (WHERE e.grounded), 4) AS mean_score
FROM evidence e
WHERE e.grounded IS NOT NULL AND ($run_id IS NULL OR e.run_id = $run_id)
GROUP BY ALL
ORDER BY e.tenant, e.run_id, e.schema_id, grounded_share, field""")

QUERIES: Mapping[str, NamedQuery] = MappingProxyType(
    {q.name: q for q in (COST_BY_RUN, REJECT_REASONS, CACHE_SAVINGS, TOKENS_BY_SCHEMA, SLOWEST_DOCUMENTS,
                         SPEND_BY_VENDOR, UNFIT_VALUES, ANSWER_ENDS, UNGROUNDED_VALUES,
                         GROUNDED_BY_FIELD)})


def get(name: str) -> NamedQuery:
    try:
        return QUERIES[name]
    except KeyError:
        raise ValueError(f"unknown query {name!r}; known: {', '.join(QUERIES)}") from None


def listing() -> str:
    width = max(len(n) for n in QUERIES)
    return "\n".join(f"{q.name:<{width}}  {q.description}" for q in QUERIES.values())


def run(output: str, name: str, storage: StorageConfig | None = None, run_id: str | None = None,
        tenant: str | None = None, source: sql.TableSource | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(columns, rows) of a named query over every run under `output` (or one tenant's), or one run; `source`:
    the committed Iceberg tables instead of the part files."""
    q = get(name)
    con = sql.connect(output, storage, tenant, read_only=False, source=source)
    try:
        con.register("reason_codes", pa.table({"code": list(REASON_CODES), "meaning": list(REASON_CODES.values())}))
        sql.lock(con)  # read-only from here on, like `pagemill sql`
        rel = con.execute(q.sql, {"run_id": run_id})
        return [d[0] for d in rel.description], rel.fetchall()
    finally:
        con.close()
