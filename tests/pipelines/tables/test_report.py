"""`pagemill report`: the figures it collects, a self-contained HTML file, and charts that really draw in
headless Chromium (skipped where Debian's `chromium` is not installed)."""
from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pipelines import cli
from pipelines.tables import report
from tests.conftest import vllm_available
from tests.support import cost_runs
from tests.support.chromium import CHROMIUM, dump_dom

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")
CHARTS = ("funnel", "cost", "histogram", "reasons", "answer-ends", "speed")


def raw(output: Path, table: str, run_id: str) -> list[dict[str, Any]]:
    return [r for path in sorted((output / table).rglob("*.parquet")) for r in pq.read_table(path).to_pylist()
            if r["run_id"] == run_id]


def write_report(output: Path, html: Path, *extra: str) -> str:
    assert cli.main(["report", "--output", str(output), "--html", str(html), *extra]) == 0
    return html.read_text(encoding="utf-8")


def marks(dom: str) -> dict[str, int]:
    """data-marks of each chart's SVG (the count of bars, or dots, that the script drew)."""
    found = {}
    for chart in (*CHARTS, "runs"):
        m = re.search(rf'<div id="{chart}"><svg[^>]*data-marks="(\d+)"', dom)
        assert m, f"chart {chart} did not draw"
        found[chart] = int(m.group(1))
    return found


def assert_self_contained(text: str) -> None:
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)
    assert data and "<" not in data.group(1) and ">" not in data.group(1)  # the data cannot open or close a tag
    text = text.replace(data.group(1), "")  # (a file name in it may well read `<img src=...>`, as text)
    assert not re.search(r"<(link|iframe|img|object|embed)\b", text)
    assert not re.search(r"\b(src|href)\s*=", text)
    assert re.findall(r"https?://[^\s\"'<>]+", text) == ["http://www.w3.org/2000/svg"]  # an XML namespace, not a fetch
    assert "default-src 'none'" in text  # and the page's CSP forbids fetching anything


def test_csp_allows_its_one_script_by_hash(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The policy names the page's one executable script by its SHA-256 (CSP Level 2: base64 of the digest
    of the script element's exact text) and allows no other inline script."""
    import base64
    import hashlib

    text = report.render_html(report.collect(str(cost_runs.render_run(tmp_path_factory))))
    (policy,) = re.findall(r'http-equiv="Content-Security-Policy" content="([^"]*)"', text)
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
    assert "unsafe-inline" not in directives["script-src"] and directives["default-src"] == "'none'"
    (script,) = re.findall(r"<script>(.*?)</script>", text, re.S)  # the JSON data block is not executable
    assert len(re.findall(r"<script\b", text)) == 2 and 'type="application/json"' in text
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    assert directives["script-src"] == f"'sha256-{digest}'"


def test_funnel_is_pipeline_order() -> None:
    steps = report.funnel({"rejected": 2, "duplicate": 1, "cached": 3, "quarantined": 1, "extracted": 4,
                           "partial": 1})
    assert [(s["label"], s["value"]) for s in steps] == [
        ("listed", 12), ("accepted", 10), ("deduplicated", 9), ("not cached", 6), ("past the safety gate", 5),
        ("extracted", 4)]
    assert steps[-1]["note"] == "1 partial"


def test_render_only_run(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    output = cost_runs.render_run(tmp_path_factory)
    data = report.collect(str(output))
    docs = raw(output, "documents", "r1")
    assert data["run_id"] == "r1" and data["outcomes"] == dict(Counter(d["outcome"] for d in docs))
    assert data["funnel"][0]["value"] == len(docs) and data["histogram"] == {"bins": [], "pages": 0}
    assert [(r["route"], r["pages"]) for r in data["routes"]] == \
        Counter(r["route"] for r in raw(output, "ledger", "r1")).most_common()
    text = write_report(output, tmp_path / "r1.html")
    assert_self_contained(text)
    if CHROMIUM:
        dom = dump_dom(tmp_path / "r1.html", tmp_path)
        assert 'data-drawn="6"' in dom and f'data-charts="{" ".join(CHARTS)}"' in dom
        drawn = marks(dom)
        assert drawn["funnel"] == 6 and drawn["histogram"] == 0 and drawn["reasons"] == len(data["reasons"]) == 4
        assert drawn["answer-ends"] == 0 and data["answer_ends"] == []  # no model page, no answer


@needs_chromium
def test_a_hostile_string_stays_text(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    data = report.collect(str(cost_runs.render_run(tmp_path_factory)))
    data["output"] = "</script><script>document.body.setAttribute('data-pwned', '1')</script>"
    data["reasons"][0]["note"] = "<img src=x onerror=\"document.body.setAttribute('data-pwned', '2')\">"
    page = tmp_path / "hostile.html"
    page.write_text(report.render_html(data), encoding="utf-8")
    dom = dump_dom(page, tmp_path)
    assert "data-pwned" not in dom.split("<body", 1)[1].split(">", 1)[0] and 'data-drawn="6"' in dom
    assert "<img" not in dom.replace("&lt;img", "")  # the file name of cost_runs.HTML_NAME, too, is only text


@pytest.mark.vllm
@needs_vllm
def test_extract_run(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path, tmp_path: Path) -> None:
    output = cost_runs.extract_runs(tmp_path_factory, test_model_dir)
    data = report.collect(str(output), run_id="t1")
    ledger = raw(output, "ledger", "t1")
    model = [r for r in ledger if r["route"] == "model"]
    assert sum(b["pages"] for b in data["histogram"]["bins"]) == len(model) == data["throughput"]["engine"]["pages"]
    totals = [r["image_tokens"] + r["text_tokens"] + r["output_tokens"] for r in model]
    bins = data["histogram"]["bins"]
    assert bins[0]["from"] == min(totals) and bins[-1]["from"] <= max(totals) <= bins[-1]["to"]
    for b in bins:
        assert b["pages"] == sum(b["from"] <= t <= b["to"] for t in totals)
    routes = {r["route"]: r for r in data["routes"]}
    assert routes["model"]["usd_per_1k"] == pytest.approx(1000 * sum(r["cost_usd"] for r in model) / len(model))
    assert routes["duplicate"]["usd_per_1k"] == 0
    manifest = json.loads((output / "runs" / "tenant=default" / "t1.json").read_text())
    assert data["throughput"]["run"]["pages_per_s"] == pytest.approx(len(ledger) / manifest["wall_seconds"])
    assert [r["run_id"] for r in data["throughput"]["runs"]] == ["t1", "t2"]
    assert report.collect(str(output))["run_id"] == "t2"  # the latest by default
    assert data["savings"] and data["savings"][0]["saved_usd"] > 0
    # Why each model answer ended: every model page has a stop reason, and the report adds them up by reason.
    assert all(r["stop_reason"] in ("stop", "length", "repetition", "deadline") for r in model)
    ends = Counter(r["stop_reason"] for r in model)
    assert {e["label"]: e["value"] for e in data["answer_ends"]} == ends
    for e in data["answer_ends"]:
        mine = [r for r in model if r["stop_reason"] == e["label"]]
        assert e["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in mine), abs=1e-6)
        assert e["cached_prompt_tokens"] == sum(r["cached_prompt_tokens"] for r in mine)
        assert e["prompt_tokens"] == sum(r["image_tokens"] + r["text_tokens"] for r in mine)
    # The run's pages share their system prompt and schema: the prefix cache held part of most prompts.
    assert sum(r["cached_prompt_tokens"] > 0 for r in model) >= len(model) - 1

    text = write_report(output, tmp_path / "t1.html", "--run-id", "t1")
    assert_self_contained(text)
    if CHROMIUM:
        dom = dump_dom(tmp_path / "t1.html", tmp_path)
        assert f'data-drawn="{6 + bool(data["grounded"]["fields"])}"' in dom  # + values found, where answers had any
        drawn = marks(dom)
        assert drawn == {"funnel": 6, "cost": 2 * len(data["routes"]), "histogram": len(bins),
                         "reasons": len(data["reasons"]), "answer-ends": len(ends), "speed": 3, "runs": 2}


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "--output", str(tmp_path / "none"), "--html", str(tmp_path / "x.html")]) == 1
    assert "no run" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


def test_estimate_sql_and_report_over_s3(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The three commands with s3:// inputs and outputs, against a real S3 server on loopback (moto)."""
    import os
    import sys
    import threading
    import time

    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        endpoint, deadline = None, time.monotonic() + 60
        while endpoint is None and time.monotonic() < deadline:
            found = re.search(r"Running on (http://127\.0\.0\.1:\d+)", proc.stdout.readline())
            endpoint = found.group(1) if found else None
        assert endpoint, "moto did not start"
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, os.environ.get(name, ""))  # restored after the test: configure() sets them
        flags = ["--s3-endpoint-url", endpoint, "--s3-access-key-id", "testing", "--s3-secret-access-key", "testing",
                 "--s3-region", "us-east-1"]
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                          region_name="us-east-1")
        bucket = "pagemill-report"
        s3.create_bucket(Bucket=bucket)
        inputs, output = cost_runs.inputs_folder(tmp_path_factory), cost_runs.render_run(tmp_path_factory)
        for folder, prefix in ((inputs, "in"), (output, "out")):
            for path in folder.rglob("*"):
                if path.is_file():
                    s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(folder)}", Body=path.read_bytes())

        root = f"s3://{bucket}"
        capsys.readouterr()
        assert cli.main(["estimate", "--input", f"{root}/in/", "--output", f"{root}/out", "--format", "json",
                         "--max-side", "800", *flags]) == 0
        estimated = json.loads(capsys.readouterr().out)
        assert estimated["documents"]["listed"] == len(list(inputs.iterdir()))
        assert estimated["pages"]["to_model"] == 9
        assert cli.main(["sql", "--output", f"{root}/out", "--query", "cost-by-run", "--format", "json", *flags]) == 0
        (run,) = json.loads(capsys.readouterr().out)
        assert run["run_id"] == "r1" and run["pages"] == len(raw(output, "ledger", "r1"))
        assert cli.main(["report", "--output", f"{root}/out", "--html", f"{root}/report.html", *flags]) == 0
        page = s3.get_object(Bucket=bucket, Key="report.html")["Body"].read().decode()
        assert_self_contained(page)
        assert json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1))["run_id"] == "r1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
