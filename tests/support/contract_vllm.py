"""The vLLM engines as subjects of the contract suite (contract_suite.py), around an engine that a test file
already started (the session's `engine` fixture): no engine is started for the suite.
- vllm_local: the engine itself; it dies by a fault in its step (the seam tests inject faults at): its core
  raises, as a dead EngineCore does.
- vllm_machine: the real worker side (VllmMachineEngine: the model's tokenizer, the folder, socket, handshake,
  frames, restart protocol) and the real service code (open_service, accept_workers) in threads of this process
  around the same engine; it dies as its service process does: the service stops listening and the worker's
  connection drops, with the worker's request held in the engine. The next service holds the same engine (a real
  new service has a new one, which counts on from the folder's starts: test_machine_service_loop.py)."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.contract_suite import WAIT_S, Subject
from tests.support.machine_stubs import Running, wait_until
from transforms.engines.base import Completion
from transforms.engines.vllm_machine import service as machine_service  # makers: the one place naming engine modules
from transforms.engines.vllm_machine.engine import SOCKET, VllmMachineEngine
from transforms.engines.vllm_machine.settings import VllmMachineSettings


def held_by(engine: Any) -> Callable[[], int]:
    """The requests a started local vLLM engine holds, by vLLM's own count."""
    return lambda: engine.llm.llm_engine.get_num_unfinished_requests()


def local_subject(engine: Any, model: str) -> Subject:
    def die(submit: Callable[[], Future[Completion]]) -> Future[Completion]:
        def dead(core: Any) -> Any:
            del engine._step  # once: the restarted engine steps as before
            raise RuntimeError("EngineCore died unexpectedly (injected)")

        engine._step = dead  # armed before the request: its first step is the one that fails
        return submit()

    return Subject(engine, engine.settings.kind, model, die, held_by(engine))


class ThreadServiceEngine(VllmMachineEngine):
    """The machine engine whose service runs in threads of this process around `inner`, a started local engine."""

    inner: Any = None
    service: Any = None

    def _spawn(self) -> Running:  # type: ignore[override]
        sock = self.directory / SOCKET
        if sock.exists():
            sock.unlink()
        self.service = machine_service.open_service(self.directory, lambda settings, directory: self.inner)
        threading.Thread(target=machine_service.accept_workers, args=(self.service,), daemon=True).start()
        return Running()

    def close(self) -> None:
        super().close()
        if self.service is not None:
            self.service.stop()

    def kill_service(self) -> None:
        """As the service process's death looks from the worker: nobody listens, and the connection drops."""
        self.service.stop()
        conn = self._conn
        assert conn is not None
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_RDWR)


@contextmanager
def machine_subject(inner: Any, model: str) -> Iterator[Subject]:
    """The subject while in the `with`; then the engine is shut down (its service stops) and its folder, a short
    private path (a Unix socket's path has ~107 bytes), removed."""
    base = Path(tempfile.mkdtemp(prefix="pm-"))
    folder = base / "svc"
    engine = ThreadServiceEngine(VllmMachineSettings(vllm=inner.settings, service_dir=str(folder)))
    engine.inner = inner

    def die(submit: Callable[[], Future[Completion]]) -> Future[Completion]:
        gate = threading.Event()
        real_step = inner._step

        def held(core: Any) -> Any:
            gate.wait()
            return real_step(core)

        inner._step = held  # the request stays in the engine until the service is gone
        try:
            future = submit()
            assert wait_until(lambda: held_by(inner)() > 0, WAIT_S)
            engine.kill_service()
            future.exception(timeout=WAIT_S)
        finally:
            del inner._step
            gate.set()
        return future

    try:
        yield Subject(engine, engine.settings.kind, model, die, held_by(inner))
    finally:
        engine.shutdown()
        shutil.rmtree(base, ignore_errors=True)
