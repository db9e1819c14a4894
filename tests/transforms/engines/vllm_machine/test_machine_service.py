"""The engine service's protocol over its real socket and a real service process (engines/vllm_machine/engine.py),
with a stub engine inside the service where vLLM is not what is tested (the real tiny engine behind the service:
tests/pipelines/test_engine_service.py). Pages, errors, a wrong authkey, malformed frames and pickles in both
directions, a peer that dies mid-frame, two workers racing to start the service, and a planted folder."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.conftest import CORPUS
from tests.support.feeding import vllm_request
from tests.support.machine_stubs import (
    FIELDS,
    SAMPLING,
    SERVICES,
    StubRemoteEngine,
    ThreadRemoteEngine,
    answer,
    raw_client,
    settings,
    wait_until,
)
from transforms.child_process import python_argv
from transforms.engines.base import EngineDead, Prepared, RequestRejected
from transforms.engines.simulated import SimTokenizer
from transforms.engines.vllm_machine import engine as machine
from transforms.engines.vllm_machine import wire
from transforms.engines.vllm_machine.engine import SOCKET, VllmMachineEngine
from transforms.engines.vllm_machine.folder import FolderRefused, read_authkey, service_env
from transforms.engines.vllm_shared.templated import Templated, page_pixels
from transforms.extract.feed import PageFeed, page_request
from transforms.extract.stage import make_task
from transforms.pages.sizes import capped_size

PAGE = CORPUS / "extraction_gt" / "invoice-x__invoice2data" / "tests" / "compare" / "AmazonWebServices.png"


def jpeg_page() -> bytes:
    """A corpus page as the page stage sends it on: at most 1288 px, JPEG q90."""
    img = Image.open(PAGE).convert("RGB")
    img = img.resize(capped_size(img.width, img.height, 1288), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.mark.parametrize("service", SERVICES)
def test_pages_reach_the_engine_as_the_same_pixels_as_a_local_engine(folder: Path, service: str) -> None:
    """The request the feed builds (what a local engine gets) and what the stub engine got through the service:
    same size, mode and pixels, at full detail, capped for low detail, and shrunk to the token budget."""
    from schemas.records import PageImage
    from tests.support.feed_setup import config

    data = jpeg_page()
    page = PageImage(doc_sha256="d" * 64, source_uri="p.jpg", page_index=0, page_hash="0" * 64, image=data,
                     width=1, height=1)
    cfg = config()
    templated = Templated(SimTokenizer())  # the local engine's prompt, with the simulated tokenizer
    roomy = templated.prepare(page_request(make_task(page, cfg)[1], cfg))
    tight = replace(cfg, max_model_len=roomy.text_tokens + cfg.max_tokens + 600)
    cases = [(page, cfg), (replace(page, detail_side=512), cfg), (page, tight)]
    engine = SERVICES[service](settings(folder))
    sizes = []
    for p, c in cases:
        req = templated.prepare(page_request(make_task(p, c)[1], c))
        local = req.request["multi_modal_data"]["image"]
        remote = engine.prepare(page_request(make_task(p, c)[1], c))
        assert "multi_modal_data" not in remote.request  # in flight, the worker holds the page's bytes, not pixels
        assert (remote.width, remote.height, remote.text_tokens) == (req.width, req.height, req.text_tokens)
        got = answer(engine.submit(remote, SAMPLING))
        assert (tuple(got["size"]), got["mode"]) == (local.size, local.mode)
        assert got["sha256"] == hashlib.sha256(local.tobytes()).hexdigest()
        assert got["prompt"] == req.request["prompt"] and got["sampling"] == FIELDS
        assert got["keys"] == ["multi_modal_data", "prompt"]  # the engine gets vLLM's request, nothing else
        sizes.append(local.size)
    full, low, shrunk = sizes
    assert max(low) == 512 and max(full) == 1288 and shrunk[0] < full[0]  # three different images, all equal
    # A request that carries only a PIL image is sent losslessly: the same pixels again.
    img = Image.frombytes("RGB", (64, 48), bytes(range(256)) * 36)
    got = answer(engine.submit(vllm_request("p", img), SAMPLING))
    assert got["sha256"] == hashlib.sha256(img.tobytes()).hexdigest()
    engine.close()


@pytest.mark.parametrize("service", SERVICES)
def test_a_page_crosses_the_socket_as_its_encoded_bytes(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                        service: str) -> None:
    data = jpeg_page()
    engine = SERVICES[service](settings(folder))
    answer(engine.submit(vllm_request("warm", Image.new("RGB", (8, 8))), SAMPLING))
    sent: list[int] = []
    conn = engine._connected()
    real = conn.send_bytes
    monkeypatch.setattr(conn, "send_bytes", lambda buf: (sent.append(len(buf)), real(buf))[1])
    from transforms.engines.base import PageSource

    img = page_pixels(data, 0)
    request = {"prompt": "p", "multi_modal_data": {"image": img}, "page": PageSource(data, 0, img.size)}
    assert answer(engine.submit(Prepared(request, 0, *img.size), SAMPLING))["size"] == list(img.size)
    assert len(sent) == 1 and len(data) < sent[0] < len(data) + 1024  # the JPEG and a small header
    assert sent[0] * 10 < len(img.tobytes())  # not the pixels (what the old framing sent)
    engine.close()


@pytest.mark.parametrize("service", SERVICES)
def test_answers_errors_restart_and_abort_cross_the_socket(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                           service: str) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-only")
    monkeypatch.setenv("PIPELINE_OPTIONS", '{"s3_secret_access_key": "worker-only"}')
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = SERVICES[service](settings(folder))
    img = Image.new("RGB", (8, 8))
    with pytest.raises(RequestRejected, match="rejected by the stub"):
        engine.submit(vllm_request("reject", img), SAMPLING).result(timeout=60)
    with pytest.raises(EngineDead, match="stub died"):
        engine.submit(vllm_request("die", img), SAMPLING).result(timeout=60)
    done = engine.submit(vllm_request("ok", img), SAMPLING).result(timeout=60)
    if service == "process":  # what only a service process can show
        seen = json.loads(done.output.text)
        assert seen["safe_path"]  # started with -P: the current folder is not on its sys.path
        # The service's environment is minimal: the engine's variables, not the worker's credentials.
        assert "VLLM_CPU_KVCACHE_SPACE" in seen["env"] and "PYTHONPATH" in seen["env"]
        assert "AWS_SECRET_ACCESS_KEY" not in seen["env"] and "PIPELINE_OPTIONS" not in seen["env"]
    assert (done.gpu_seconds, done.output.cached_prompt_tokens, done.output.token_counts) == (0.25, 2, (2, 1, 2))
    assert done.output.finish_reason == "stop"
    assert engine.starts == 1
    engine.restart(1)
    assert engine.starts == 2
    held = engine.submit(vllm_request("hold", img), SAMPLING)
    engine.abort(held)  # --answer-timeout-s: the engine in the service frees the request
    with pytest.raises(RuntimeError, match="aborted"):
        held.result(timeout=60)
    assert wait_until((folder / "aborted").exists)
    answer(engine.submit(vllm_request("after", img), SAMPLING))
    engine.close()


def still_serves(folder: Path) -> None:
    """A new worker still gets its page answered: the service lives on."""
    engine = StubRemoteEngine(settings(folder))
    assert answer(engine.submit(vllm_request("after", Image.new("RGB", (4, 4))),
                                SAMPLING))["prompt"] == "after"
    engine.close()


@pytest.mark.parametrize("service", SERVICES)
def test_a_wrong_authkey_is_refused_and_the_service_serves_on(folder: Path, service: str) -> None:
    first = SERVICES[service](settings(folder))
    answer(first.submit(vllm_request("x", Image.new("RGB", (4, 4))), SAMPLING))
    with pytest.raises(AuthenticationError):
        raw_client(folder, b"w" * 32)
    still_serves(folder)
    answer(first.submit(vllm_request("y", Image.new("RGB", (4, 4))), SAMPLING))
    if service == "process":
        assert len((folder / "stub.pid").read_text().split()) == 1  # the same service all along
    first.close()


class Planted:
    """What a pickle from a peer would run: creating a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("service", SERVICES)
def test_malformed_frames_and_pickles_end_only_their_connection(folder: Path, service: str) -> None:
    first = SERVICES[service](settings(folder))
    answer(first.submit(vllm_request("x", Image.new("RGB", (4, 4))), SAMPLING))
    key = read_authkey(folder)
    marker = folder.parent / "unpickled-by-the-service"
    hostile = [
        lambda c: c.send(Planted(marker)),                                  # the old protocol's pickle
        lambda c: c.send_bytes(b"not a frame"),
        lambda c: wire.send(c, {"kind": "starts", "starts": 1}),            # a reply sent to the service
        lambda c: c.send_bytes(struct.pack(">I", 4) + b"{}}}"),
        lambda c: c._send(struct.pack("!i", wire.MAX_FRAME + 1)),           # over the size limit: never read
    ]
    for send in hostile:
        conn = raw_client(folder, key)
        send(conn)
        with pytest.raises((EOFError, OSError)):
            conn.recv_bytes()  # the service closed this connection
        conn.close()
    # A peer that dies mid-frame: the length of a 1,000-byte frame, 10 bytes of it, gone.
    conn = raw_client(folder, key)
    conn._send(struct.pack("!i", 1000) + b"0123456789")
    conn.close()
    still_serves(folder)
    answer(first.submit(vllm_request("y", Image.new("RGB", (4, 4))), SAMPLING))
    if service == "process":
        assert len((folder / "stub.pid").read_text().split()) == 1  # the same service all along
    assert not marker.exists()
    first.close()


@pytest.mark.parametrize("reply", ["a pickle", "half a frame, then gone"])
def test_a_worker_does_not_unpickle_what_the_service_sends(folder: Path, reply: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A service (a fake one, holding the folder's real key) that answers with a pickle, or dies mid-frame: the
    worker loads nothing; the page in flight fails as a lost connection (the feed resubmits it)."""
    engine = StubRemoteEngine(settings(folder))
    marker = folder.parent / "unpickled-by-the-worker"
    from transforms.engines.vllm_machine.folder import prepare_folder

    prepare_folder(folder)
    key = engine._authkey()
    listener = Listener(str(folder / SOCKET), family="AF_UNIX", authkey=key)

    def fake_service() -> None:
        conn = listener.accept()
        conn.recv_bytes()
        if reply == "a pickle":
            conn.send(Planted(marker))
            time.sleep(1)
        else:
            conn._send(struct.pack("!i", 1000) + b"0123456789")
        conn.close()

    thread = threading.Thread(target=fake_service, daemon=True)
    thread.start()
    with caplog.at_level("ERROR", logger=machine.__name__):
        future = engine.submit(vllm_request("x", Image.new("RGB", (4, 4))), SAMPLING)
        with pytest.raises(EngineDead, match=r"^engine service connection lost$"):
            future.result(timeout=30)
    thread.join(timeout=10)
    listener.close()
    assert not marker.exists()
    if reply == "a pickle":  # refused, and said why (half a frame is only a lost connection)
        with pytest.raises(wire.FrameError) as why:
            wire.decode(ForkingPickler.dumps(Planted(marker)).tobytes(), wire.TO_WORKER)
        logged = [r.getMessage() for r in caplog.records]
        assert logged == [f"engine service sent a malformed frame; connection closed: {why.value}"]


def race_worker(directory: str, go: str) -> None:
    """One worker process of the race: wait for the start signal, then submit a page and print the answer."""
    while not os.path.exists(go):
        time.sleep(0.005)
    engine = StubRemoteEngine(settings(Path(directory)))
    img = Image.new("RGB", (4, 4))
    print(json.dumps(answer(engine.submit(vllm_request(f"pid {os.getpid()}", img),
                                          SAMPLING))))
    engine.close()


def test_two_workers_racing_to_start_the_service_share_one(folder: Path) -> None:
    go = folder.parent / "go"
    code = ("import sys; from tests.transforms.engines.vllm_machine.test_machine_service import race_worker; "
            "race_worker(sys.argv[1], sys.argv[2])")
    workers = [subprocess.Popen(python_argv("-c", code, str(folder), str(go)), stdout=subprocess.PIPE,
                                env=service_env(os.environ, sys.path), text=True) for _ in range(2)]
    time.sleep(0.5)  # both past their imports, waiting for the signal (a late one only makes the race easier)
    go.touch()
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0]
    prompts = sorted(json.loads(out.strip().splitlines()[-1])["prompt"] for out in outputs)
    assert prompts == sorted(f"pid {w.pid}" for w in workers)  # both served
    assert len((folder / "stub.pid").read_text().split()) == 1  # by one service
    assert len((folder / "starts").read_text().split()) == 1  # with one engine


@pytest.mark.parametrize("with_authkey", [True, False])
def test_a_planted_folder_receives_no_prompt_and_no_page(monkeypatch: pytest.MonkeyPatch, with_authkey: bool) -> None:
    """Another user's folder with a listening server (and a readable authkey, or none for the worker to create)
    where the run's folder should be: the worker refuses it before connecting, and its pages fail with
    engine_error saying why."""
    from tests.support.feed_setup import config, page
    from tests.support.folder_attacks import plant_as_other_user

    base = Path(tempfile.mkdtemp(prefix="pm-"))
    planted = base / "svc"
    planted.mkdir(mode=0o700)
    if with_authkey:
        (planted / "authkey").write_bytes(b"k" * 32)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(planted / SOCKET))
    server.listen(8)
    server.settimeout(0.2)
    connected: list[bytes] = []
    stop = threading.Event()

    def planted_server() -> None:  # records whatever a worker would send it, and hangs up
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    connected.append(conn.recv(1 << 20))
                except OSError:
                    connected.append(b"")

    thread = threading.Thread(target=planted_server, daemon=True)
    thread.start()
    try:
        plant_as_other_user(monkeypatch)(planted)
        engine = StubRemoteEngine(settings(planted))
        with pytest.raises(FolderRefused, match="owned by uid"):
            engine.submit(vllm_request("secret prompt", Image.new("RGB", (4, 4))),
                          SAMPLING)
        cfg = replace(config(), max_attempts=2)
        feed = PageFeed(engine, cfg, max_in_flight=2)
        key, task = make_task(page(1), cfg)
        result, first = feed.claim(key)
        assert first
        feed.slots.acquire()
        feed.start(task, result)
        row = result.result(timeout=60)
        assert (row.status, row.reason_code) == ("failed", "engine_error")
        assert "owned by uid" in (row.message or "")
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
        monkeypatch.undo()
        shutil.rmtree(base, ignore_errors=True)
    assert connected == []  # nobody ever connected to the planted server


def test_the_real_service_starts_as_a_module_with_a_safe_path(folder: Path) -> None:
    assert VllmMachineEngine(settings(folder)).service_argv() == [sys.executable, "-P", "-m",
                                                                  "transforms.engines.vllm_machine.engine", str(folder)]


class ExitingRemoteEngine(StubRemoteEngine):
    """A service that cannot start: it says why on stderr (its log) and exits. Counts the worker's attempts to
    connect made after the service had exited."""

    after_exit = 0
    proc: subprocess.Popen[bytes] | None = None

    def service_argv(self) -> list[str]:
        return python_argv("-c", "import sys; print('ImportError: a broken install', file=sys.stderr); sys.exit(3)")

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.proc = super()._spawn()
        return self.proc

    def _try_connect(self, authkey: bytes) -> Connection | None:
        self.after_exit += self.proc is not None and self.proc.poll() is not None
        return super()._try_connect(authkey)


def test_a_service_that_exits_at_start_fails_the_request_with_its_error(folder: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "CONNECT_TIMEOUT_S", 5.0)  # were the exit missed, this test would end in 5 s
    engine = ExitingRemoteEngine(settings(folder))
    with pytest.raises(RuntimeError, match=r"exited with code 3 .*ImportError: a broken install"):
        engine.submit(vllm_request("p", Image.new("RGB", (4, 4))), SAMPLING)
    assert engine.after_exit <= 1  # it stopped waiting once the service was gone (one try may race the exit)


def test_the_service_counts_its_workers_for_its_idle_exit(folder: Path) -> None:
    """What the idle exit reads: workers connected now, and since when none was (a worker's pages done or not)."""
    first = ThreadRemoteEngine(settings(folder))
    answer(first.submit(vllm_request("a", Image.new("RGB", (4, 4))), SAMPLING))
    service = first._service
    second = raw_client(folder, read_authkey(folder))  # a second worker, connected and idle
    wait_until(lambda: service.state["clients"] == 2)
    assert service.state["clients"] == 2
    before = service.state["idle_since"]
    second.close()
    wait_until(lambda: service.state["clients"] == 1)
    assert service.state["clients"] == 1 and service.state["idle_since"] > before
    first.close()
    assert service.stopped.is_set()
    wait_until(lambda: service.state["clients"] == 0)
    assert service.state["clients"] == 0  # the last worker gone: what starts the idle exit's grace period


def test_the_worker_side_says_how_many_sequences_it_runs(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "is_cpu_platform", lambda: False)
    assert VllmMachineEngine(settings(folder)).sequences() == 4  # max_num_seqs, as the service's engine runs them
    big = VllmMachineEngine(settings(folder, max_num_seqs=64))
    assert big.sequences() == 64
    monkeypatch.setattr(machine, "is_cpu_platform", lambda: True)
    assert big.sequences() == 16  # a CPU engine runs at most 16 at once


def test_start_connects_or_fails_as_a_dead_engine_saying_why(folder: Path) -> None:
    engine = ThreadRemoteEngine(settings(folder))
    engine.start()
    engine.start()  # already connected: nothing more
    assert (folder / SOCKET).exists() and len(list(folder.parent.glob("svc"))) == 1
    engine.close()
    shared = folder.parent / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)  # group and others may enter: refused before anything is written there
    with pytest.raises(EngineDead, match=r"the engine service: FolderRefused: .* has mode 0755"):
        ThreadRemoteEngine(settings(shared)).start()
    assert sorted(p.name for p in shared.iterdir()) == []
