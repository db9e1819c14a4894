"""VllmMachineEngine: one vLLM engine per machine (`--engine vllm_machine`), fed by every worker process of the run
on that machine.

With several worker processes (`--direct_running_mode=multi_processing`, or several SDK processes
on a Dataflow VM) a per-process engine would mean one vLLM engine per process, and on one GPU the
second cannot get memory. Instead the first worker process that needs the model starts an engine
service process (`python -P -m transforms.engines.vllm_machine.engine DIR`: service.py; one per DIR, guarded by a
file lock, with a minimal environment: folder.service_env); every worker process connects to it through a
local Unix socket in DIR (multiprocessing.connection's HMAC handshake, with a random authkey kept in DIR).

DIR is private to the user (folder.py): created 0700 in a per-user base, and both
checked (a real directory, ours, no group/other bits) before any use by a worker or the service; a folder that
fails is refused (`FolderRefused`: the pages fail with `engine_error`, the run says why).

Frames, not pickles (wire.py): a page crosses the socket as its encoded bytes (the
JPEG the page stage made) with its detail side and target size, and the service makes the engine's pixels with
the function the local engine path uses (templated.page_pixels), so the engine sees exactly what a local engine
would; the prompt text and the sampling fields go as JSON. Results come back as text, finish reason, token
counts (the service's engine counts them) and gpu_seconds. Prompts are built in the workers with the model's
tokenizer, loaded there (vllm_shared/templated.py). The service exits a
few seconds after its last worker disconnects.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, replace
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from transforms.child_process import python_argv
from transforms.engines.base import Answer, Completion, EngineDead, PageRequest, Prepared, RequestRejected, Sampling
from transforms.engines.vllm_local.vllm_args import engine_sequences, is_cpu_platform
from transforms.engines.vllm_machine import wire
from transforms.engines.vllm_machine.folder import (
    AUTHKEY_BYTES,
    last_line,
    open_private,
    prepare_folder,
    read_authkey,
    service_env,
    write_new,
)
from transforms.engines.vllm_machine.service import IDLE_EXIT_S as IDLE_EXIT_S
from transforms.engines.vllm_machine.service import SOCKET as SOCKET
from transforms.engines.vllm_machine.service import serve as serve
from transforms.engines.vllm_machine.settings import VllmMachineSettings
from transforms.engines.vllm_shared.templated import Templated

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 120.0


class VllmMachineEngine:
    """A worker process's handle on the machine's engine service (the PageEngine contract, transforms/engines/base.py):
    prompts are built here with the model's tokenizer; the service runs them."""

    def __init__(self, settings: VllmMachineSettings) -> None:
        if not settings.service_dir:
            raise ValueError("VllmMachineEngine needs VllmMachineSettings.service_dir")
        self.settings = settings
        self.directory = Path(settings.service_dir)
        self.starts = 0
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._conn: Connection | None = None
        # rid -> (the connection it was sent on, its future): a reader that loses its connection fails only its own
        self._futures: dict[int, tuple[Connection, Future[Completion]]] = {}
        self._next = 0
        self._restarted = threading.Condition()
        self._restart_replies = 0  # answers to "restart" (a failed restart answers too, starts unchanged)
        self._templated: Templated | None = None

    def tokenizer(self) -> Any:
        if self._templated is None:
            from vllm.tokenizers import get_tokenizer

            model = self.settings.vllm.model
            revision = None if Path(model).exists() else self.settings.vllm.model_revision
            self._templated = Templated(get_tokenizer(model, revision=revision))
        return self._templated.tokenizer

    def start(self) -> None:
        """Connect to the service, starting it if need be; EngineDead when that fails."""
        try:
            self._connected()
        except Exception as err:
            raise EngineDead(f"the engine service: {type(err).__name__}: {err}") from err

    def sequences(self) -> int:
        return engine_sequences(self.settings.vllm, is_cpu_platform())

    def prepare(self, request: PageRequest) -> Prepared:
        """The prompt with the model's tokenizer, loaded in this process (EngineDead when it cannot be)."""
        try:
            tokenizer = self.tokenizer()
        except Exception as err:
            raise EngineDead(f"its tokenizer: {type(err).__name__}: {err}") from err
        if self._templated is None or self._templated.tokenizer is not tokenizer:
            self._templated = Templated(tokenizer)
        prepared = self._templated.prepare(request)
        # The service decodes the page itself: while in flight, the worker keeps its bytes, not its pixels.
        return replace(prepared, request={k: v for k, v in prepared.request.items() if k != "multi_modal_data"})

    def submit(self, prepared: Prepared, sampling: Sampling) -> Future[Completion]:
        """Send the page's encoded bytes (its fitted PageSource); a request with only a PIL image is sent as
        lossless PNG. RequestRejected over the frame limits."""
        request = prepared.request
        source = request.get("page")
        if source is not None:
            data, side = source.data, source.detail_side
            size = source.size or (prepared.width, prepared.height)
        else:
            img = request["multi_modal_data"]["image"]
            data, side, size = wire.encode_png(img), 0, img.size
        with self._lock:
            self._next += 1
            rid = self._next
        try:
            frame = wire.encode(wire.submit_header(rid, request["prompt"], sampling.fields(), side, size), data)
        except wire.FrameError as err:
            raise RequestRejected(str(err)) from err
        conn = self._connected()
        future: Future[Completion] = Future()
        with self._lock:
            self._futures[rid] = (conn, future)
        try:
            with self._send_lock:
                conn.send_bytes(frame)
        except Exception:
            with self._lock:
                self._futures.pop(rid, None)
            raise
        return future

    def abort(self, future: Future[Completion]) -> None:
        """The service aborts the request in its engine (--answer-timeout-s); its future fails here at once."""
        with self._lock:
            rid = next((r for r, (_, f) in self._futures.items() if f is future), None)
            self._futures.pop(rid, None)
            conn = self._conn
        if rid is None or conn is None:
            return
        future.set_exception(RuntimeError("request aborted"))
        with self._send_lock:
            wire.send(conn, {"kind": "abort", "rid": rid})

    def restart(self, seen: int | None = None) -> None:
        conn = self._connected()
        with self._restarted:
            answered = self._restart_replies
            with self._send_lock:
                wire.send(conn, {"kind": "restart", "seen": seen if seen is not None else self.starts})
            self._restarted.wait_for(lambda: self._restart_replies != answered or self._conn is None, timeout=3600)

    def shutdown(self) -> None:
        self.close()

    def close(self) -> None:
        """Hang up: the reader thread wakes and fails what is still in flight, and the service counts this
        worker gone now, not when its process exits (a plain close leaves a blocked reader blocked)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone
            conn.close()

    def _connected(self) -> Connection:
        with self._lock:
            if self._conn is not None:
                return self._conn
            prepare_folder(self.directory)  # FolderRefused: nothing in a folder we do not own is used
            with os.fdopen(open_private(self.directory / "lock", os.O_RDWR | os.O_CREAT), "r+b") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts the service, the others wait for it
                authkey = self._authkey()
                conn = self._try_connect(authkey)
                if conn is None:
                    conn = self._start_service(authkey)
            self._conn = conn
            threading.Thread(target=self._read, args=(conn,), name="pagemill-engine-client", daemon=True).start()
            return conn

    def _start_service(self, authkey: bytes) -> Connection:
        """Spawn the service and connect once it listens. A service that exits first (its folder refused, a
        broken install) raises at once, with the last line of its log."""
        proc = self._spawn()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            conn = self._try_connect(authkey)
            if conn is not None:
                return conn
        code = proc.poll()
        why = f"exited with code {code}" if code is not None else f"did not listen in {CONNECT_TIMEOUT_S:g} s"
        raise RuntimeError(f"engine service {why} ({self.directory}): {last_line(self.directory / 'service.log')}")

    def _authkey(self) -> bytes:
        """The folder's authkey, created (O_EXCL, 0600) with the service's settings by the first worker."""
        if write_new(self.directory / "authkey", secrets.token_bytes(AUTHKEY_BYTES)):
            fd = open_private(self.directory / "settings.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with os.fdopen(fd, "w") as handle:
                json.dump(asdict(self.settings.vllm), handle)  # the service's VllmLocalSettings
        return read_authkey(self.directory)

    def _try_connect(self, authkey: bytes) -> Connection | None:
        try:
            return Client(str(self.directory / SOCKET), family="AF_UNIX", authkey=authkey)
        except (FileNotFoundError, ConnectionRefusedError):
            return None

    def service_argv(self) -> list[str]:
        """The service's command line (tests start a stub engine's service here)."""
        return python_argv("-m", "transforms.engines.vllm_machine.engine", str(self.directory))

    def _spawn(self) -> subprocess.Popen[bytes]:
        sock = self.directory / SOCKET
        if sock.is_symlink() or sock.exists():
            sock.unlink()  # left by a service that died
        fd = open_private(self.directory / "service.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        with os.fdopen(fd, "ab") as out:
            return subprocess.Popen(self.service_argv(), stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                    env=service_env(os.environ, sys.path), start_new_session=True, close_fds=True)

    def _read(self, conn: Connection) -> None:
        while True:
            try:
                header, _ = wire.recv(conn, wire.TO_WORKER)
            except (EOFError, OSError):
                break
            except wire.FrameError as err:
                log.error("engine service sent a malformed frame; connection closed: %s", err)
                conn.close()
                break
            if header["kind"] == "starts":
                with self._restarted:
                    self.starts = header["starts"]
                    self._restart_replies += 1
                    self._restarted.notify_all()
                continue
            self.starts = max(self.starts, header["starts"])
            with self._lock:
                sent = self._futures.pop(header["rid"], None)
            if sent is None:
                continue
            future = sent[1]
            if header["kind"] == "done":
                image, text, output = header["tokens"]
                answer = Answer(header["text"], header["finish_reason"], image, text, output, header["cached_tokens"])
                future.set_result(Completion(answer, header["gpu_seconds"]))
            else:
                error = RequestRejected if header["error"] == "rejected" else EngineDead
                future.set_exception(error(header["message"]))
        # The service went away: what was in flight on this connection fails (and is resubmitted to a new service);
        # requests sent on a newer connection (after a shutdown and a new start) are not this reader's.
        with self._lock:
            if self._conn is conn:
                self._conn = None
            lost = [f for rid, (c, f) in self._futures.items() if c is conn]
            self._futures = {rid: sent for rid, sent in self._futures.items() if sent[0] is not conn}
        for future in lost:
            future.set_exception(EngineDead("engine service connection lost"))
        with self._restarted:
            self._restarted.notify_all()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(Path(sys.argv[1]))
