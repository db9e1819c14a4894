"""`--write-markdown`: one markdown file per document of a run, for people who want files, not tables.

After the run's tables are written, its `pages` rows (latest per page) are read back and each document
whose pages carry markdown becomes `<output>/markdown/tenant=<tenant>/<doc_sha256>.md`: its pages in
order, each under a `<!-- page N -->` line (a page without markdown says why). The name is the document's
sha256, never a name taken from the input, so a file can only land inside the output root. Each file is
written to a temporary name beside it and then moved into place (a rename on a local disk), and a file
whose content is already there is left alone: a re-run or a resume rewrites nothing that did not change.
"""
from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow.fs as pafs

from pipelines.config.storage import StorageConfig, arrow_filesystem
from pipelines.tables import sql
from schemas import layout

SHA256 = re.compile(r"[0-9a-f]{64}")


def document_markdown(pages: Sequence[tuple[int, str | None, str, str | None]]) -> str:
    """A document's file from its pages' (page_index, markdown, status, reason_code), in page order. Pure."""
    parts = []
    for index, text, status, reason in sorted(pages, key=lambda p: p[0]):
        head = f"<!-- page {index + 1} -->"
        if text is None:
            parts.append(f"{head}\n<!-- no markdown: {status}{', ' + reason if reason else ''} -->")
        else:
            parts.append(f"{head}\n{text}")
    return "\n\n".join(parts) + "\n"


def _grouped(rows: Iterable[tuple[Any, ...]]) -> dict[str, list[tuple[int, str | None, str, str | None]]]:
    docs: dict[str, list[tuple[int, str | None, str, str | None]]] = {}
    for sha, index, text, status, reason in rows:
        docs.setdefault(sha, []).append((index, text, status, reason))
    return docs


def write_markdown(output: str, tenant: str, run_id: str, storage: StorageConfig | None = None) -> int:
    """Write (or leave in place, when unchanged) one file per document of the run that has markdown.
    Returns the number of documents with a file."""
    con = sql.connect(output, storage, tenant, typed=False)
    try:
        rows = con.execute(
            "SELECT doc_sha256, page_index, markdown, status, reason_code FROM pages "
            "WHERE run_id = ? AND doc_sha256 IN "
            "(SELECT doc_sha256 FROM pages WHERE run_id = ? AND markdown IS NOT NULL)", [run_id, run_id]).fetchall()
    finally:
        con.close()
    fs, root = arrow_filesystem(output, storage or StorageConfig())
    folder = layout.markdown_folder(root, tenant)
    fs.create_dir(folder, recursive=True)
    docs = _grouped(rows)
    for sha, pages in docs.items():
        if not SHA256.fullmatch(sha or ""):
            continue  # not a sha256: never a file name
        _write_if_changed(fs, f"{folder}/{sha}.md", document_markdown(pages).encode("utf-8"))
    return len(docs)


def _write_if_changed(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_stream(path) as handle:
            if handle.read() == data:
                return
    tmp = f"{path}.tmp-{secrets.token_hex(4)}"
    with fs.open_output_stream(tmp) as handle:
        handle.write(data)
    fs.move(tmp, path)
