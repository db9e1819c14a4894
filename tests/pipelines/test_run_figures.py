"""Every figure a finished run reports (the closing summary it prints, the manifest's counts and totals, the ledger's
columns) against values derived here from the objects the test made and the engine it gave the run, not read back
from the code that adds them up. A simulated engine of known cost (transforms/engines/simulated.py: each answer
takes `SECONDS / SLOTS` GPU seconds and `len(ANSWER) // 4` output tokens), so it runs in seconds without vLLM."""
from __future__ import annotations

import contextlib
import functools
import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pipelines import cli
from pipelines.run import graph
from tests.support import docmaker
from tests.support.raw import one_row_per, raw_rows
from transforms.engines.simulated import SimulatedEngine

ANSWER = json.dumps({"vendor_name": None, "invoice_number": None, "issue_date": None, "due_date": None,
                     "currency": None, "subtotal": None, "tax": None, "total": 1.0, "line_items": []})
SLOTS, SECONDS = 4, 0.02
GPU_SECONDS = SECONDS / SLOTS  # one answer's share of the simulated GPU: 0.005 s
HOURLY_USD = 3.6  # $0.001 a GPU second: an answer costs $0.000005
# What each object becomes: (outcome, reason, pages that reach the model).
OBJECTS = {"a-invoice.pdf": ("extracted", None, 1), "b-report.pdf": ("extracted", None, 3),
           "c-invoice-copy.pdf": ("duplicate", None, 0), "d-corrupt.pdf": ("rejected", "unreadable", 0),
           "e-notes.txt": ("rejected", "unsupported_format", 0)}
MODEL_PAGES = sum(n for _, _, n in OBJECTS.values())  # 4


def engine(settings: Any) -> SimulatedEngine:
    return SimulatedEngine(slots=SLOTS, seconds=SECONDS, text=ANSWER)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The run's output root and what it printed on stdout."""
    root = tmp_path_factory.mktemp("figures")
    inputs = root / "in"
    inputs.mkdir()
    invoice = docmaker.invoice_pdf(seed=7)
    made = {"a-invoice.pdf": invoice, "b-report.pdf": docmaker.multipage_pdf(3, title="figures"),
            "c-invoice-copy.pdf": invoice, "d-corrupt.pdf": docmaker.truncated_pdf(), "e-notes.txt": b"not a doc\n"}
    for name, data in made.items():
        (inputs / name).write_bytes(data)
    model = root / "model"  # the simulated engine reads nothing from it: the checks want a folder
    model.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph, "build_pipeline", functools.partial(graph.build_pipeline, engine_factory=engine))
        out = io.StringIO()  # a module fixture cannot use capsys
        with contextlib.redirect_stdout(out):
            code = cli.main(["run", "--input", str(inputs), "--output", str(root / "out"), "--run-id", "f",
                             "--schema", "invoice", "--model", str(model), "--model-family", "qwen2_vl",
                             "--max-side", "400", "--nsfw-classifier", "none", "--hints", "text_layer",
                             "--max-attempts", "1", "--gpu-hourly-usd", str(HOURLY_USD), "--workers", "1",
                             "--progress-every-s", "0"])
    assert code == 0, out.getvalue()
    return root / "out", out.getvalue()


def manifest(output: Path) -> dict[str, Any]:
    return json.loads((output / "runs" / "tenant=default" / "f.json").read_text())


def ledger(output: Path) -> list[dict[str, Any]]:
    return list(one_row_per(raw_rows(output, "ledger", "f"), "doc_sha256", "page_index").values())


def test_ledger_columns_are_the_engines_figures(run: tuple[Path, str]) -> None:
    rows = ledger(run[0])
    assert len(rows) == MODEL_PAGES
    for row in rows:
        assert (row["route"], row["attempts"]) == ("model", 1)
        assert row["output_tokens"] == len(ANSWER) // 4
        assert row["gpu_seconds"] == pytest.approx(GPU_SECONDS)
        assert row["cost_usd"] == pytest.approx(GPU_SECONDS * HOURLY_USD / 3600)
        # An A4 page (595 x 842 pt) at --max-side 400 is 283 x 400 px; Qwen2-VL sizes it to 28-px blocks,
        # 280 x 392, and merges 2 x 2 of its 14-px patches a token: 10 x 14 = 140.
        assert row["image_tokens"] == 140
        assert row["text_tokens"] > 0 and row["api_equivalent_usd"] > 0


def test_manifest_counts_and_totals(run: tuple[Path, str]) -> None:
    m = manifest(run[0])
    rows = ledger(run[0])
    assert m["documents"] == len(OBJECTS)
    assert m["outcomes"] == dict(Counter(o for o, _, _ in OBJECTS.values()))
    assert m["reject_reasons"] == dict(Counter(r for o, r, _ in OBJECTS.values() if o == "rejected"))
    assert m["pages"] == {"ok": MODEL_PAGES}
    totals = m["totals"]
    assert (totals["pages"], totals["model_calls"]) == (MODEL_PAGES, MODEL_PAGES)
    assert totals["output_tokens"] == MODEL_PAGES * (len(ANSWER) // 4)
    assert totals["gpu_seconds"] == pytest.approx(MODEL_PAGES * GPU_SECONDS)
    assert totals["cost_usd"] == pytest.approx(MODEL_PAGES * GPU_SECONDS * HOURLY_USD / 3600, abs=1e-6)
    for column in ("image_tokens", "text_tokens"):  # the engine's own counts, summed from the raw rows
        assert totals[column] == sum(r[column] for r in rows)
    assert totals["api_equivalent_usd"] == pytest.approx(sum(r["api_equivalent_usd"] for r in rows), abs=1e-6)
    assert m["this_invocation"] == {"documents": len(OBJECTS), "pages": MODEL_PAGES, "model_calls": MODEL_PAGES}
    assert m["resumed"] is False
    timings = m["stage_timings"]
    assert (timings["documents_done"], timings["pages_done"]) == (len(OBJECTS), MODEL_PAGES)
    assert timings["objects_submitted"] == len(OBJECTS)


def test_closing_summary(run: tuple[Path, str]) -> None:
    rows = ledger(run[0])
    lines = run[1].splitlines()
    first = re.fullmatch(r"pagemill: (\d+) documents, (\d+) pages in [\d.]+ s \([\d.]+ pages/s\), "
                         r"model calls (\d+) by this invocation", lines[0])
    assert first and first.groups() == (str(len(OBJECTS)), str(MODEL_PAGES), str(MODEL_PAGES)), lines[0]
    assert lines[1] == f"  the run:  {len(OBJECTS)} documents, {MODEL_PAGES} pages in all"

    def listed(prefix: str) -> dict[str, int]:
        (line,) = [x for x in lines if x.startswith(prefix)]
        return {k: int(v) for k, v in (item.rsplit(" ", 1) for item in line[len(prefix):].split(", "))}

    assert listed("  outcomes: ") == dict(Counter(o for o, _, _ in OBJECTS.values()))
    assert listed("  reasons:  ") == {"unreadable": 1, "unsupported_format": 1}
    assert listed("  pages:    ") == {"ok": MODEL_PAGES}
    tokens_in = sum(r["image_tokens"] + r["text_tokens"] for r in rows)
    cost = MODEL_PAGES * GPU_SECONDS * HOURLY_USD / 3600
    api = sum(r["api_equivalent_usd"] for r in rows)
    assert f"  model calls {MODEL_PAGES}, tokens in {tokens_in}, out {MODEL_PAGES * (len(ANSWER) // 4)}, " \
           f"cost ${cost:.6f} (hosted API ${api:.6f})" in lines
