"""Each engine service's figures (transforms/engines/vllm_machine/stats.py): counted by the service per answer in
its folder, counted on by a restarted service, read back as the manifest's `engines`; and the test fault that
makes one device's service exit (service.py FAULT_ENV)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PIL import Image

from tests.support.feeding import vllm_request
from tests.support.machine_stubs import FIELDS, ThreadRemoteEngine, settings
from transforms.engines.base import Sampling
from transforms.engines.simulated import PAGE_TEXT, SimulatedSettings
from transforms.engines.vllm_machine.service import fault_due
from transforms.engines.vllm_machine.stats import EngineStats, busy_fraction, engine_figures, manifest_entry, read


def test_the_service_counts_every_answer_and_a_new_service_of_the_folder_counts_on(folder: Path) -> None:
    seconds, slots = 0.02, 2
    machine = replace(settings(folder), device="cpu1", simulated=SimulatedSettings(slots=slots, seconds=seconds))
    page = vllm_request("a page", Image.new("RGB", (64, 48), "white"))
    for answers in (3, 1):  # a first service, then another in the same folder (its engine died)
        engine = ThreadRemoteEngine(machine)
        futures = [engine.submit(page, Sampling.of_fields(FIELDS)) for _ in range(answers)]
        assert all(f.result(timeout=60).output.text == PAGE_TEXT for f in futures)
        engine.close()
    found = read(folder)
    assert found is not None and found["device"] == "cpu1" and found["pages"] == 4
    assert found["output_tokens"] == 4 * (len(PAGE_TEXT) // 4)  # the simulated engine's count: a token per 4 chars
    assert abs(found["busy_seconds"] - 4 * seconds / slots) < 1e-9  # each answer's share of its slot's time
    (entry,) = engine_figures(folder)
    assert entry["device"] == "cpu1" and entry["pages"] == 4 and entry["starts"] >= 1
    assert 0 < entry["busy_fraction"] <= 1


def test_busy_fraction_is_busy_seconds_over_first_request_to_last_answer() -> None:
    assert busy_fraction(3.0, 10.0, 16.0) == 0.5
    assert busy_fraction(9.0, 10.0, 16.0) == 1.0  # capped
    assert busy_fraction(1.0, None, 16.0) is None and busy_fraction(1.0, 16.0, 16.0) is None
    entry = manifest_entry({"device": "3", "pages": 7, "output_tokens": 70, "busy_seconds": 1.5, "first_at": 0.0,
                            "last_at": 2.0, "starts": 2})
    assert entry == {"device": "3", "pages": 7, "output_tokens": 70, "busy_fraction": 0.75, "starts": 2}


def test_the_manifest_lists_the_machines_engine_then_each_device_in_order(tmp_path: Path) -> None:
    for name, device in (("device-10", "10"), ("device-2", "2"), ("device-0", "0")):
        (tmp_path / name).mkdir()
        EngineStats(device, pages=int(device) + 1).write(tmp_path / name)
    (tmp_path / "device-3").mkdir()  # started, never answered nor wrote: not listed
    assert [(e["device"], e["pages"]) for e in engine_figures(tmp_path)] == [("0", 1), ("2", 3), ("10", 11)]
    (tmp_path / "device-2" / "stats.json").write_text("not json")
    assert [e["device"] for e in engine_figures(tmp_path)] == ["0", "10"]


def test_the_test_fault_fires_once_on_its_device_at_its_count(tmp_path: Path) -> None:
    assert not fault_due("cpu1:2", "cpu1", 1, tmp_path)
    assert not fault_due("cpu1:2", "cpu0", 5, tmp_path)
    for malformed in (None, "", "cpu1", "cpu1:x"):
        assert not fault_due(malformed, "cpu1", 5, tmp_path)
    assert fault_due("cpu1:2", "cpu1", 2, tmp_path)
    assert not fault_due("cpu1:2", "cpu1", 3, tmp_path)  # the restarted service does not exit again
