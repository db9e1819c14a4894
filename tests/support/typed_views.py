"""The typed view of invoice.json as DuckDB describes it: DESCRIBE_INVOICE.
Moved from tests/pipelines/tables/test_typed_views.py, which other test files imported."""
from __future__ import annotations

KEYS = [("tenant", "VARCHAR"), ("run_id", "VARCHAR"), ("doc_sha256", "VARCHAR"), ("source_uri", "VARCHAR"),
        ("page_index", "BIGINT"), ("extracted_at", "TIMESTAMP WITH TIME ZONE")]


# invoice.json by hand: strings -> VARCHAR; issue_date and due_date are strings whose pattern admits only
# YYYY-MM-DD -> DATE; subtotal, tax, total are numbers -> DOUBLE; line_items is an array of objects of a
# string and three numbers -> a LIST of STRUCT. Then the two columns that count values that did not fit, and the
# evidence of each top-level text, date and number (not line_items): found on the page, and where.
BOX = "STRUCT(x0 DOUBLE, y0 DOUBLE, x1 DOUBLE, y1 DOUBLE)"
DESCRIBE_INVOICE = [*KEYS, ("vendor_name", "VARCHAR"), ("invoice_number", "VARCHAR"), ("issue_date", "DATE"),
                    ("due_date", "DATE"), ("currency", "VARCHAR"), ("subtotal", "DOUBLE"), ("tax", "DOUBLE"),
                    ("total", "DOUBLE"),
                    ("line_items", "STRUCT(description VARCHAR, quantity DOUBLE, unit_price DOUBLE, amount DOUBLE)[]"),
                    ("unfit_columns", "VARCHAR[]"), ("unfit_values", "BIGINT"),
                    *[(f"{field}{suffix}", kind) for field in ("vendor_name", "invoice_number", "issue_date",
                                                                "due_date", "currency", "subtotal", "tax", "total")
                      for suffix, kind in (("_grounded", "BOOLEAN"), ("_box", BOX))]]
