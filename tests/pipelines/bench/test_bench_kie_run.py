"""`pagemill bench sroie` and `pagemill bench cord` end to end with the tiny random Qwen2.5-VL over the receipt
fixtures of tests/fixtures/bench/ (each dataset's own layout). Random weights score near zero: what is checked is
that each run's comparison line says what the run's own tables say (model, pages, score, $/1k pages, pages/s),
with the score recomputed here from the `pages` table's extractions and the datasets' truth files."""
from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.tables import sql
from tests.conftest import vllm_available

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "bench"
FLAGS = ["--max-tokens", "96", "--kv-cache-gib", "0.25", "--progress-every-s", "0", "--workers", "1"]


def leaves(tree: Any, path: str = "") -> list[tuple[str, str]]:
    """(key path, text) of every non-empty leaf; list items share their list's path (CORD's field pairs)."""
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in leaves(v, f"{path}.{k}" if path else k)]
    if isinstance(tree, list):
        return [p for v in tree for p in leaves(v, path)]
    text = "" if tree is None else str(tree).strip()
    return [(path, text)] if text else []


def f1(pairs: list[tuple[list[Any], list[Any]]]) -> float:
    """F1 over (predicted items, truth items) of every document: an item is right when an equal truth item of the
    same document is left to match it."""
    tp = predicted = truth = 0
    for got, want in pairs:
        left = list(want)
        for item in got:
            if item in left:
                left.remove(item)
                tp += 1
        predicted, truth = predicted + len(got), truth + len(want)
    return 2 * tp / (predicted + truth) if predicted + truth else 0.0


def sroie_items(fields: dict[str, Any] | None) -> list[tuple[str, str]]:
    fields = fields or {}
    return [(k, str(v).strip()) for k in ("company", "date", "address", "total")
            if (v := fields.get(k)) is not None and str(v).strip()]


def extractions(output: Path, run_id: str) -> dict[str, dict[str, Any] | None]:
    """Each document's page-0 extraction (parsed), keyed by the file name of its source URI."""
    _, rows = sql.query(str(output), f"SELECT source_uri, extraction FROM pages WHERE run_id = '{run_id}' "
                                     "AND page_index = 0")
    return {uri.rsplit("/", 1)[-1]: (json.loads(e) if e else None) for uri, e in rows}


def expected_score(bench: str, output: Path, run_id: str) -> float:
    got = extractions(output, run_id)
    if bench == "sroie":
        truth = {p.stem: json.loads(p.read_text()) for p in sorted((FIXTURES / "sroie").glob("*.txt"))}
        return f1([(sroie_items(got.get(f"{rid}.jpg")), sroie_items(t)) for rid, t in truth.items()])
    rows = [json.loads(line) for line in (FIXTURES / "cord" / "metadata.jsonl").read_text().splitlines()]
    return f1([(leaves(got.get(r["file_name"]) or {}), leaves(json.loads(r["ground_truth"])["gt_parse"]))
               for r in rows])


def run_bench(bench: str, model: Path, output: Path, engine: Path) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = cli.main(["bench", bench, "--data", str(FIXTURES / bench), "--output", str(output), "--run-id", bench,
                         "--model", str(model), *FLAGS, "--engine-service", "machine",
                         "--engine-service-dir", str(engine)])
    assert code == 0, buffer.getvalue()
    return buffer.getvalue().strip().splitlines()[-1]


def check_line(bench: str, line: str, output: Path) -> None:
    _, [(pages, models)] = sql.query(str(output), "SELECT count(*), string_agg(DISTINCT model, ', ') FROM pages "
                                                  f"WHERE run_id = '{bench}'")
    _, [(ledger_pages, cost)] = sql.query(str(output), "SELECT count(*), sum(cost_usd) FROM ledger "
                                                       f"WHERE run_id = '{bench}'")
    _, [(wall,)] = sql.query(str(output), f"SELECT max(wall_seconds) FROM runs WHERE run_id = '{bench}'")
    images = len([p for p in (FIXTURES / bench).iterdir() if p.suffix in (".jpg", ".png")])
    assert pages == ledger_pages == images  # one page an image, each with its ledger row

    _, statuses = sql.query(str(output), f"SELECT status, count(*) FROM pages WHERE run_id = '{bench}' GROUP BY 1")
    fields = [f.strip() for f in line.split("|")]
    assert fields[:2] == [bench, f"model {models}"] and fields[2].startswith(f"pages {pages} (ok ")
    assert all(f"{status} {count}" in fields[2] for status, count in statuses)
    f1 = f"{100 * expected_score(bench, output, bench):.1f}%"
    if bench == "cord":  # Donut's nTED accuracy first (a share), the field F1 named beside it
        assert fields[3].startswith("nTED accuracy ") and fields[3].endswith(f"field F1 {f1}")
        assert 0 <= float(fields[3].split()[2].rstrip("%")) <= 100
    else:
        assert fields[3].split()[:2] == ["score", f1]
    assert fields[4] == f"$/1k pages ${1000 * cost / pages:.4f}"
    assert fields[5] == f"pages/s {pages / wall:.3f}"


def test_bench_sroie_and_cord_print_what_the_tables_say(tmp_path: Path, tiny_model: Callable[[str], Path]) -> None:
    # One engine for both runs: the machine's engine service, which the second run finds still up (it exits 10 s
    # after its last worker left; a run that comes later starts it again) and feeds its own schema's pages.
    for bench in ("sroie", "cord"):
        output = tmp_path / bench
        check_line(bench, run_bench(bench, tiny_model("qwen2_5_vl"), output, tmp_path / "engine"), output)
