"""Bytes and CPU per page over the engine service's socket: the old raw-pixel pickles against today's frames.

Renders corpus PDFs with the page stage's own function (transforms.pages.render.render_document: JPEG q90 at
1288 px, as pages reach the extract stage), then sends every page to an engine service whose engine is a stub
that answers at once (no vLLM; the socket is what is measured):
  - baseline: the framing before issue 26 (`baseline_submit` / `baseline_serve`, kept here): the worker
    pickles (mode, size, raw RGB pixels) with conn.send, the service unpickles and Image.frombytes;
  - frames: the real worker (transforms.engines.vllm_machine.engine.VllmMachineEngine) and the real service loop
    (machine.serve): a JSON header + the page's encoded bytes, decoded and sized in the service by
    templated.page_pixels.
Both paths get the decoded page before the clock (the worker's prepare decodes it in both: the budget needs
its size). Prints bytes a page on the wire, and CPU ms a page in the worker (process_time of this process
around the sends and the reader thread) and in the service (its /proc utime+stime). Asserts nothing.

    .venv/bin/python benchmarks/bench_engine_socket.py [--pages 60] [--in-flight 8]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Client, Listener
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from PIL import Image  # noqa: E402

from schemas.records import DocumentRecord, PageImage  # noqa: E402
from tests.conftest import corpus_dir  # noqa: E402
from transforms.child_process import python_argv  # noqa: E402
from transforms.engines.base import Answer, Completion, PageSource, Prepared, Sampling  # noqa: E402
from transforms.engines.vllm_local.settings import VllmLocalSettings  # noqa: E402
from transforms.engines.vllm_machine import wire  # noqa: E402
from transforms.engines.vllm_machine.engine import SOCKET, VllmMachineEngine, serve  # noqa: E402
from transforms.engines.vllm_machine.settings import VllmMachineSettings  # noqa: E402
from transforms.engines.vllm_shared.templated import page_pixels  # noqa: E402
from transforms.pages.render import RenderSettings, render_document  # noqa: E402

FIELDS = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "json": {"type": "object"}}
SAMPLING = Sampling.of_fields(FIELDS)
ANSWER = '{"ok": true}'


class StubEngine:
    """Answers every page at once: what the service costs without an engine."""

    starts = 1

    def __init__(self, settings: Any, directory: Path) -> None:
        pass

    def submit(self, prepared: Prepared, sampling: Any) -> Future[Completion]:
        future: Future[Completion] = Future()
        future.set_result(Completion(Answer(ANSWER, "stop", 1, 2, 2), 0.0))
        return future

    def abort(self, future: Future[Completion]) -> None:
        pass

    def restart(self, seen: int | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def baseline_serve(directory: Path) -> None:
    """The service before issue 26 (one connection): unpickle the request, rebuild the pixels, answer."""
    listener = Listener(str(directory / SOCKET), family="AF_UNIX", authkey=(directory / "authkey").read_bytes())
    conn = listener.accept()
    engine = StubEngine(None, directory)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        _, rid, prompt, (mode, size, pixels), params = message
        image = Image.frombytes(mode, size, pixels)
        c = engine.submit(Prepared({"prompt": prompt, "multi_modal_data": {"image": image}}, 0, *size), params).result()
        # The old reply's shape: the prompt's token ids and the samples' (text, token ids, finish reason).
        samples = [(c.output.text, (4, 5), c.output.finish_reason)]
        conn.send(("done", rid, [1, 2, 3], samples, c.gpu_seconds, 1))


def baseline_submit(rid: int, prompt: str, img: Image.Image, params: Any) -> tuple[Any, ...]:
    """The message the worker pickled before issue 26."""
    return ("submit", rid, prompt, (img.mode, img.size, img.tobytes()), params)


def figures(sent: int, worker_s: float, service_s: float, pages: int) -> dict[str, float]:
    return {"bytes": sent / pages, "worker_ms": worker_s * 1000 / pages, "service_ms": service_s * 1000 / pages}


def cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def service_pid(directory: Path) -> int:
    return int((directory / "bench.pid").read_text())


def corpus_pages(limit: int) -> list[PageImage]:
    """Pages of the corpus's extraction PDFs as the page stage renders them (the pipeline's render defaults)."""
    settings = RenderSettings(dpi=150.0, max_side=1288, jpeg_quality=90, max_text_chars=20_000,
                              max_page_points=14_400.0, max_image_pixels=89_478_485, max_bytes=50 * 2**20)
    pages: list[PageImage] = []
    for path in sorted((corpus_dir() / "extraction_gt").rglob("*.pdf")):
        data = path.read_bytes()
        import pypdfium2 as pdfium

        try:
            count = len(pdfium.PdfDocument(data))
        except pdfium.PdfiumError:
            continue
        doc = DocumentRecord(uri=str(path), size=len(data), doc_sha256=hashlib.sha256(data).hexdigest(),
                             format="pdf", page_count=count)
        for page in render_document(doc, data, settings):
            if isinstance(page, PageImage):
                pages.append(page)
            if len(pages) >= limit:
                return pages
    return pages


def run_baseline(pages: list[tuple[PageImage, Image.Image]], directory: Path, in_flight: int) -> dict[str, float]:
    (directory / "authkey").write_bytes(os.urandom(32))
    proc = spawn(directory, "--serve-baseline")
    conn = None
    while conn is None:
        try:
            conn = Client(str(directory / SOCKET), family="AF_UNIX", authkey=(directory / "authkey").read_bytes())
        except (FileNotFoundError, ConnectionRefusedError):
            time.sleep(0.05)
    slots = threading.Semaphore(in_flight)

    def read() -> None:
        for _ in pages:
            conn.recv()
            slots.release()

    reader = threading.Thread(target=read)
    s0, w0 = cpu_s(proc.pid), time.process_time()
    reader.start()
    for rid, (_, img) in enumerate(pages):
        slots.acquire()
        conn.send(baseline_submit(rid, "prompt", img, FIELDS))
    reader.join()
    worker, service = time.process_time() - w0, cpu_s(proc.pid) - s0
    conn.close()
    proc.wait(timeout=30)
    sent = sum(len(ForkingPickler.dumps(baseline_submit(0, "prompt", img, FIELDS))) for _, img in pages)
    return figures(sent, worker, service, len(pages))


class BenchRemoteEngine(VllmMachineEngine):
    def service_argv(self) -> list[str]:
        return python_argv(str(Path(__file__).resolve()), "--serve-frames", str(self.directory))


def run_frames(pages: list[tuple[PageImage, Image.Image]], directory: Path, in_flight: int) -> dict[str, float]:
    local = VllmLocalSettings(model="stub", model_revision=None, max_model_len=8192, max_num_seqs=4,
                              gpu_memory_utilization=0.9, tensor_parallel_size=1, limit_mm_per_prompt=1,
                              kv_cache_gib=None, enforce_eager=True)
    settings = VllmMachineSettings(local, str(directory))
    engine = BenchRemoteEngine(settings)
    warm = Image.new("RGB", (8, 8))
    warmup = Prepared({"prompt": "warm", "multi_modal_data": {"image": warm}}, 0, 8, 8)
    engine.submit(warmup, SAMPLING).result(timeout=120)
    slots = threading.Semaphore(in_flight)
    pid = service_pid(directory)
    frames = 0
    s0, w0 = cpu_s(pid), time.process_time()
    futures = []
    for page, img in pages:
        slots.acquire()
        request = {"prompt": "prompt", "multi_modal_data": {"image": img},
                   "page": PageSource(page.image, page.detail_side, img.size)}
        future = engine.submit(Prepared(request, 0, *img.size), SAMPLING)
        future.add_done_callback(lambda _: slots.release())
        futures.append(future)
    for future in futures:
        future.result(timeout=120)
    worker, service = time.process_time() - w0, cpu_s(pid) - s0
    engine.close()
    for page, img in pages:
        frames += len(wire.encode(wire.submit_header(0, "prompt", FIELDS, page.detail_side, img.size), page.image))
    return figures(frames, worker, service, len(pages))


def spawn(directory: Path, mode: str) -> Any:
    import subprocess

    return subprocess.Popen(python_argv(str(Path(__file__).resolve()), mode, str(directory)))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] in ("--serve-baseline", "--serve-frames"):
        directory = Path(sys.argv[2])
        (directory / "bench.pid").write_text(str(os.getpid()))
        return baseline_serve(directory) if sys.argv[1] == "--serve-baseline" else serve(directory, StubEngine)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=60, help="corpus pages to send")
    parser.add_argument("--in-flight", type=int, default=8, help="pages in flight on the socket")
    args = parser.parse_args()
    rendered = corpus_pages(args.pages)
    pages = [(p, page_pixels(p.image, p.detail_side)) for p in rendered]  # decoded before the clock, as prepare does
    base = Path(tempfile.mkdtemp(prefix="pm-bench-"))
    try:
        old = run_baseline(pages, private(base / "old"), args.in_flight)
        new = run_frames(pages, base / "new", args.in_flight)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    jpeg = sum(len(p.image) for p in rendered) / len(rendered)
    pixels = sum(len(img.tobytes()) for _, img in pages) / len(pages)
    print(f"{len(pages)} corpus pages (JPEG q90, mean {jpeg / 1024:.0f} KiB encoded, {pixels / 2**20:.2f} MiB as RGB "
          f"pixels), {args.in_flight} in flight, stub engine behind the service")
    print(json.dumps({"baseline_pixels": old, "frames_encoded": new}, indent=1))
    for name, r in (("baseline (pickled RGB pixels)", old), ("frames (JSON header + encoded bytes)", new)):
        print(f"  {name:38s} {r['bytes'] / 1024:9.1f} KiB a page; CPU ms a page: worker {r['worker_ms']:.2f}, "
              f"service {r['service_ms']:.2f}, both {r['worker_ms'] + r['service_ms']:.2f}")
    print(f"  bytes a page: frames/baseline = 1/{old['bytes'] / new['bytes']:.1f}")


def private(folder: Path) -> Path:
    folder.mkdir(mode=0o700)
    return folder


if __name__ == "__main__":
    main()
