"""The machine engine's test doubles: a stub engine inside the real service loop and socket (in a service process,
or in threads of the test process where mutmut sees the service's code), and the settings they run with."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from transforms.child_process import python_argv
from transforms.engines.base import Answer, Completion, EngineDead, Prepared, RequestRejected, Sampling
from transforms.engines.simulated import SimTokenizer
from transforms.engines.vllm_local.settings import VllmLocalSettings
from transforms.engines.vllm_machine import service as machine_service
from transforms.engines.vllm_machine.engine import SOCKET, VllmMachineEngine, serve
from transforms.engines.vllm_machine.settings import VllmMachineSettings

FIELDS = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "json": {"type": "object"}}
SAMPLING = Sampling.of_fields(FIELDS)


class StubEngine:
    """The Engine interface inside the service: echoes what reached it (prompt, sampling fields, the image's
    size, mode and pixel hash); "reject" and "die" fail as a rejected request and a dead engine, "long" as a
    rejection with a 3,000-character message, "crash" raises from submit (an engine that cannot start); "hold"
    waits for an abort (which it notes in DIR/aborted). A `restart_error` set on it fails its restarts."""

    def __init__(self, settings: VllmLocalSettings, directory: Path) -> None:
        self.settings, self.directory, self.starts = settings, directory, 0
        self.lock = threading.Lock()
        self.restart_error: Exception | None = None

    def submit(self, prepared: Prepared, sampling: Sampling) -> Future[Completion]:
        request = prepared.request
        with self.lock:
            if self.starts == 0:
                self.starts = 1
                with open(self.directory / "starts", "a") as handle:
                    handle.write(f"{os.getpid()}\n")
        future: Future[Completion] = Future()
        img = request["multi_modal_data"]["image"]
        if request["prompt"] == "hold":
            return future
        if request["prompt"] == "crash":
            raise RuntimeError("stub crashed")
        if request["prompt"] == "long":
            future.set_exception(RequestRejected("x" * 3000))
            return future
        if request["prompt"] in ("reject", "die"):
            err = RequestRejected("rejected by the stub") if request["prompt"] == "reject" else EngineDead("stub died")
            future.set_exception(err)
            return future
        text = json.dumps({"prompt": request["prompt"], "sampling": sampling.fields(), "size": img.size,
                           "mode": img.mode,
                           "sha256": hashlib.sha256(img.tobytes()).hexdigest(), "keys": sorted(request),
                           "env": sorted(os.environ), "safe_path": sys.flags.safe_path})
        future.set_result(Completion(Answer(text, "stop", 2, 1, 2, cached_prompt_tokens=2), 0.25))
        return future

    def abort(self, future: Future[Completion]) -> None:
        (self.directory / "aborted").touch()
        future.set_exception(RuntimeError("aborted by the stub"))

    def restart(self, seen: int | None = None) -> None:
        if self.restart_error is not None:
            raise self.restart_error
        with self.lock:
            if seen is None or seen == self.starts:
                self.starts += 1

    def close(self) -> None:
        pass


def serve_stub(directory: str) -> None:
    """The service process of these tests: the real service loop and socket, the stub engine, the sampling
    fields as they arrived."""
    with open(Path(directory) / "stub.pid", "a") as handle:
        handle.write(f"{os.getpid()}\n")
    serve(Path(directory), StubEngine)


class StubRemoteEngine(VllmMachineEngine):
    """The real worker side, starting the stub's service; the feed's tokenizer and fields without vLLM."""

    def service_argv(self) -> list[str]:
        code = ("import sys; from tests.support.machine_stubs import serve_stub; "
                "serve_stub(sys.argv[1])")
        return python_argv("-c", code, str(self.directory))

    def tokenizer(self) -> SimTokenizer:
        return SimTokenizer()


class Running:
    """What `_start_service` polls in place of the service's Popen: a thread that never exits on its own."""

    def poll(self) -> None:
        return None


class ThreadRemoteEngine(StubRemoteEngine):
    """The real worker side, with the service (machine_service.open_service and accept_workers, the stub engine
    behind them) in threads of this process instead of a service process: the same folder checks, socket,
    handshake and frames, and the service's code runs where the test runs (mutmut sees and mutates it there; a
    child process runs the unmutated code). Only the idle exit is the process's alone."""

    def _spawn(self) -> Running:  # type: ignore[override]
        sock = self.directory / SOCKET
        if sock.exists():
            sock.unlink()
        self._service = machine_service.open_service(self.directory, StubEngine)
        threading.Thread(target=machine_service.accept_workers, args=(self._service,), daemon=True).start()
        return Running()

    def close(self) -> None:
        super().close()
        service = getattr(self, "_service", None)
        if service is not None:  # the service stops with the engine that started it (the socket file goes too)
            service.stop()


SERVICES = {"process": StubRemoteEngine, "thread": ThreadRemoteEngine}


def settings(folder: Path, **engine: Any) -> VllmMachineSettings:
    """The machine engine's settings in `folder`; `engine` changes the service's engine settings."""
    local = VllmLocalSettings(**{"model": "stub", "model_revision": None, "max_model_len": 8192, "max_num_seqs": 4,
                                 "gpu_memory_utilization": 0.9, "tensor_parallel_size": 1, "limit_mm_per_prompt": 1,
                                 "kv_cache_gib": None, "enforce_eager": True, **engine})
    return VllmMachineSettings(local, str(folder))


def answer(future: Future[Completion]) -> dict[str, Any]:
    return json.loads(future.result(timeout=60).output.text)


def failure_of(future: Future[Completion]) -> BaseException | None:
    return future.exception(timeout=60)


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Poll `condition` until it holds or `timeout_s` passes (what another thread does, seen from the test)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def raw_client(folder: Path, authkey: bytes | None) -> Connection:
    """A peer on the service's socket, below VllmMachineEngine (authkey None: no handshake on this side)."""
    return Client(str(folder / SOCKET), family="AF_UNIX", authkey=authkey)
