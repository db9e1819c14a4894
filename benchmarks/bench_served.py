"""Served engine figures: `pagemill run --engine openai` against vLLM's real OpenAI-compatible server
(tests/support/vllm_server.py) with the tiny random test model, beside the in-process engine on the same pages.

  1. the invoice corpus (invoice2data's PDFs in the shared corpus) through the served model: pages ok with
     schema-valid JSON, usage tokens and cost in the ledger, pages/s;
  2. the same pages through the in-process engine (`--engine vllm`, the baseline measured in the same run;
     `--no-baseline` skips it);
  3. the drill: a run of --pages distinct one-page invoices, the server SIGKILLed --kill-after-s seconds into
     the run; prints how the pages ended (status and reason code), whether every input has its row, the exit
     code, and how long the run took to end after the kill.

Prints figures (JSON with --json); asserts nothing. The machine here is 2 shared cores: timings are noisy.

    .venv/bin/python benchmarks/bench_served.py --pages 150 --kill-after-s 45
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FLAGS = ["--schema", "invoice", "--max-tokens", "256", "--progress-every-s", "0"]


def figures(output: Path, run_id: str) -> dict[str, Any]:
    from pipelines.tables import sql

    def one(query: str) -> list[Any]:
        return list(sql.query(str(output), query)[1])

    statuses = dict(one(f"SELECT coalesce(status || ' ' || reason_code, status), count(*) FROM pages "
                        f"WHERE run_id = '{run_id}' GROUP BY 1"))
    docs = one(f"SELECT count(*) FROM documents WHERE run_id = '{run_id}'")[0][0]
    ledger = one(f"SELECT route, count(*), sum(image_tokens), sum(text_tokens), sum(output_tokens), "
                 f"round(sum(gpu_seconds), 2), round(sum(cost_usd), 6) FROM ledger WHERE run_id = '{run_id}' "
                 "GROUP BY 1 ORDER BY 2 DESC")
    pages = sum(statuses.values())
    return {"pages": pages, "documents": docs, "statuses": statuses,
            "ok_share": round(statuses.get("ok", 0) / pages, 3) if pages else None,
            "ledger": [dict(zip(("route", "pages", "image_tokens", "text_tokens", "output_tokens", "gpu_seconds",
                                 "cost_usd"), row, strict=True)) for row in ledger]}


def run(args: list[str]) -> tuple[int, float]:
    from pipelines import cli

    t0 = time.perf_counter()
    code = cli.main(["run", *args])
    return code, time.perf_counter() - t0


def corpus(url: str | None, model: str, work: Path, name: str) -> dict[str, Any]:
    from tests.support.invoice2data_run import INPUT

    out = work / name
    engine = ["--engine", "openai", "--endpoint", url, "--model", "tiny"] if url else \
        ["--model", model, "--kv-cache-gib", "0.25"]
    code, wall = run(["--input", INPUT, "--output", str(out), "--run-id", name, *engine, *FLAGS])
    f = figures(out, name)
    return {"exit_code": code, "wall_s": round(wall, 1), "pages_per_s": round(f["pages"] / wall, 2), **f}


def drill(server: Any, pages: int, kill_after_s: float, concurrency: int, work: Path) -> dict[str, Any]:
    from tests.support import docmaker

    inputs = work / "drill-in"
    inputs.mkdir()
    for i in range(pages):
        (inputs / f"invoice-{i:04d}.pdf").write_bytes(docmaker.invoice_pdf(seed=i))
    out = work / "drill"
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(zip(("code", "wall"), run(
        ["--input", str(inputs), "--output", str(out), "--run-id", "drill", "--engine", "openai", "--endpoint",
         server.url, "--model", "tiny", "--concurrency", str(concurrency), *FLAGS]), strict=True)))
    t0 = time.perf_counter()
    thread.start()
    time.sleep(kill_after_s)
    answered = server.completions()
    server.kill()
    killed = time.perf_counter()
    thread.join(timeout=1800)
    ended = time.perf_counter()
    f = figures(out, "drill")
    return {"pages_listed": pages, "killed_at_s": round(killed - t0, 1), "completions_before_kill": answered,
            "run_ended": not thread.is_alive(), "ended_s_after_kill": round(ended - killed, 1),
            "exit_code": result.get("code"), "every_input_has_a_row": f["documents"] == pages and f["pages"] == pages,
            **f}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=150)
    parser.add_argument("--kill-after-s", type=float, default=45.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()
    from pipelines.tiny_models import make_test_model
    from tests.support.vllm_server import VllmServer

    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp:
        work = Path(tmp)
        model = make_test_model(work / "tiny")
        server = VllmServer(model, work / "server.log")
        try:
            t0 = time.perf_counter()
            server.wait_ready()
            report["server_start_s"] = round(time.perf_counter() - t0, 1)
            report["served_corpus"] = corpus(server.url, str(model), work, "served")
            if not a.no_baseline:
                report["in_process_corpus"] = corpus(None, str(model), work, "local")
            report["drill"] = drill(server, a.pages, a.kill_after_s, a.concurrency, work)
        finally:
            server.kill()
    if a.json:
        print(json.dumps(report, indent=1))
        return
    for name, value in report.items():
        print(f"{name}: {json.dumps(value, indent=1) if isinstance(value, dict) else value}")


if __name__ == "__main__":
    main()
