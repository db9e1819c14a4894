"""`pagemill sql` is read-only and prints document-derived strings safely: no file can be read or written
from SQL, terminal control characters are escaped in table output, and CSV cells that a spreadsheet would
run as formulas are neutralised."""
from __future__ import annotations

import csv
import io
import json
import sys
import unicodedata
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.tables import sql
from schemas import tables
from schemas.layout import partition
from transforms.store.write import write_rows

HOSTILE_URI = "s3://b/\x1b]0;pwned\x07report\x1b[2J.pdf"
FORMULA = "=HYPERLINK(\"http://x.invalid\",\"click\")"


@pytest.fixture
def output(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    rows = [{"run_id": "r1", "tenant": "default", "source_uri": HOSTILE_URI, "outcome": "rejected",
             "reason_code": "unreadable", "message": "line one\rOVERWRITTEN"},
            {"run_id": "r1", "tenant": "default", "source_uri": "s3://b/formula.pdf", "outcome": "rejected",
             "reason_code": "unreadable", "message": FORMULA},
            {"run_id": "r1", "tenant": "default", "source_uri": "s3://b/at.pdf", "outcome": "rejected",
             "reason_code": "unreadable", "message": "@SUM(A1)"}]
    write_rows(partition(str(out), "documents", "default", "r1"), tables.DOCUMENTS, rows)
    return out


def _sql(capsys: pytest.CaptureFixture[str], output: Path, query: str, *flags: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["sql", "--output", str(output), *flags, query])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("query", [
    "SELECT * FROM read_text('/etc/hostname')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM '/etc/passwd'",
    "ATTACH '{tmp}/attached.db'",
])
def test_files_cannot_be_read(output: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], query: str) -> None:
    code, out, err = _sql(capsys, output, query.format(tmp=tmp_path))
    assert code == 1 and out == "" and not (tmp_path / "attached.db").exists()
    assert err.count("\n") == 1 and err.startswith("pagemill sql: ")  # one clear line
    assert "read-only" in err or "does not exist" in err


def test_files_cannot_be_written(output: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "stolen.csv"
    code, _, err = _sql(capsys, output, f"COPY (SELECT * FROM documents) TO '{target}'")
    assert code == 1 and "read-only" in err and err.count("\n") == 1
    assert not target.exists()


def test_configuration_is_locked(output: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Settings that are harmless to change without the lock (DuckDB accepts them on an open connection):
    # only `lock_configuration` refuses them, so each fails here if the lock is gone.
    for query in ("SET python_enable_replacements = true", "SET lock_configuration = false", "SET threads = 1",
                  "RESET enable_external_access"):
        code, _, err = _sql(capsys, output, query)
        assert code == 1 and err.count("\n") == 1 and "configuration has been locked" in err, (query, err)
    # Refused by the file-access switch itself (locked or not), each on one line.
    for query in ("SET enable_external_access = true", "INSTALL httpfs", "LOAD httpfs"):
        code, _, err = _sql(capsys, output, query)
        assert code == 1 and err.count("\n") == 1, query
    # ... and the views still read the registered tables afterwards.
    code, out, _ = _sql(capsys, output, "SELECT count(*) AS n FROM documents", "--format", "json")
    assert (code, json.loads(out)) == (0, [{"n": 3}])


def test_table_output_escapes_control_characters(output: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _sql(capsys, output, "SELECT source_uri, message FROM documents ORDER BY 1")
    assert code == 0
    assert not any(c in out for c in "\x1b\x07\r")
    assert "s3://b/\\x1b]0;pwned\\x07report\\x1b[2J.pdf" in out and "line one\\rOVERWRITTEN" in out
    assert sql.terminal_safe("tab\there\u202eevil\x9b") == "tab\\there\\u202eevil\\x9b"
    assert sql.terminal_safe("ordinary text, ünïcode, 日本") == "ordinary text, ünïcode, 日本"


def test_table_and_csv_escape_every_format_character(output: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Every Cf character of Python's Unicode database and the tag block, one row each (chr() in SQL keeps the
    # query ASCII); each must print as its Python escape, written here from the code point.
    points = sorted({c for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"}
                    | set(range(0xE0000, 0xE0080)))
    query = f"SELECT x, 'a' || chr(x::INTEGER) || 'b' AS ch FROM unnest({points}) t(x) ORDER BY x"
    for fmt in ("table", "csv"):
        code, out, _ = _sql(capsys, output, query, "--format", fmt)
        assert code == 0 and not {chr(c) for c in points} & set(out), fmt
        for c in points:
            shown = f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"
            assert f"a{shown}b" in out, (fmt, f"U+{c:04X}")


def test_json_output_escapes_control_characters(output: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _sql(capsys, output, "SELECT source_uri FROM documents ORDER BY 1", "--format", "json")
    assert code == 0 and "\x1b" not in out and "\\u001b" in out
    assert HOSTILE_URI in [r["source_uri"] for r in json.loads(out)]  # the value itself is intact


def test_csv_neutralises_formulas(output: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _sql(capsys, output, "SELECT source_uri, message, -1 AS n, '+1' AS plus, '-x' AS minus "
                                        "FROM documents WHERE source_uri NOT LIKE '%pwned%' ORDER BY 1",
                        "--format", "csv")
    assert code == 0
    parsed = list(csv.reader(io.StringIO(out)))
    assert parsed[0] == ["source_uri", "message", "n", "plus", "minus"]
    assert parsed[1] == ["s3://b/at.pdf", "'@SUM(A1)", "-1", "'+1", "'-x"]  # a number stays a number
    assert parsed[2] == ["s3://b/formula.pdf", "'" + FORMULA, "-1", "'+1", "'-x"]
