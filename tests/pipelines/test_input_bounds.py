"""Inputs stay inside what was listed (issue 16, item 7), through the whole pipeline (render-only, no model):
a symlink inside the input folder that leads out of it is a `rejected` row (`outside_input`), its target is
never read; a symlink to a file inside the folder is followed (a `duplicate` of its target)."""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import apache_beam as beam

from pipelines.config.options import PagemillOptions
from pipelines.run.graph import build_pipeline
from pipelines.run.settings import run_settings
from pipelines.tables import sql
from tests.support import docmaker


def rows(output: Path, query: str) -> list[dict[str, Any]]:
    columns, values = sql.query(str(output), query)
    return [dict(zip(columns, v, strict=True)) for v in values]


def test_symlinks_out_of_the_input_folder_are_rejected(tmp_path: Path) -> None:
    inputs, outside, output = tmp_path / "in", tmp_path / "elsewhere", tmp_path / "out"
    inputs.mkdir()
    outside.mkdir()
    (inputs / "a.pdf").write_bytes(docmaker.invoice_pdf())
    (outside / "secret.pdf").write_bytes(docmaker.multipage_pdf(2, title="Secret"))
    (inputs / "inner.pdf").symlink_to("a.pdf")
    (inputs / "link.pdf").symlink_to(outside / "secret.pdf")
    options = PagemillOptions(["--input", str(inputs), "--output", str(output), "--run-id", "b1", "--extract",
                               "false", "--hints", "none", "--nsfw-classifier", "none", "--progress-every-s", "0"])
    o = options.view_as(PagemillOptions)
    with beam.Pipeline(options=options) as p:
        build_pipeline(p, run_settings(o), {"run_id": "b1", "tenant": o.tenant, "created_at": dt.datetime.now(dt.UTC)})
    docs = {Path(d["source_uri"]).name: d for d in rows(output, "SELECT * FROM documents")}
    assert set(docs) == {"a.pdf", "inner.pdf", "link.pdf"}
    link = docs["link.pdf"]
    assert (link["outcome"], link["reason_code"], link["doc_sha256"]) == ("rejected", "outside_input", None)
    assert {docs["a.pdf"]["outcome"], docs["inner.pdf"]["outcome"]} == {"rendered", "duplicate"}
    pages = rows(output, "SELECT source_uri FROM pages")
    assert not [p for p in pages if "link.pdf" in p["source_uri"] or "secret" in p["source_uri"]]
