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
from transforms.engines.vllm_local.settings import VllmLocalSettings
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
        if self._templated is None and self.settings.simulated is not None:
            from transforms.engines.simulated import SimTokenizer

            self._templated = Templated(SimTokenizer())
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
        if self.settings.simulated is not None:
            return self.settings.simulated.slots
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
        """Ask the service to re-create its engine. A service found gone on the way (its process died: the send
        fails before this worker's reader noticed) is dropped and started again, once."""
        for last in (False, True):
            conn = self._connected()
            with self._restarted:
                answered = self._restart_replies
                try:
                    with self._send_lock:
                        wire.send(conn, {"kind": "restart", "seen": seen if seen is not None else self.starts})
                except OSError:
                    if last:
                        raise
                    with self._lock:
                        if self._conn is conn:
                            self._conn = None  # the next _connected starts a new service
                    continue
                self._restarted.wait_for(lambda n=answered: self._restart_replies != n or self._conn is None,
                                         timeout=3600)
                return

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
        log = self.log_path()
        said = last_line(log) if log.parent == self.directory else tail_line(log)
        raise RuntimeError(f"engine service {why} ({self.directory}; its log {log}): {said}")

    def _authkey(self) -> bytes:
        """The folder's authkey, created (O_EXCL, 0600) with the service's settings by the first worker."""
        if write_new(self.directory / "authkey", secrets.token_bytes(AUTHKEY_BYTES)):
            fd = open_private(self.directory / "settings.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with os.fdopen(fd, "w") as handle:
                json.dump(service_settings(self.settings), handle)
        return read_authkey(self.directory)

    def _try_connect(self, authkey: bytes) -> Connection | None:
        try:
            return Client(str(self.directory / SOCKET), family="AF_UNIX", authkey=authkey)
        except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, BrokenPipeError, EOFError):
            return None  # none listens, or one that is exiting (it died: its listener closed in the handshake)

    def service_argv(self) -> list[str]:
        """The service's command line (tests start a stub engine's service here)."""
        return python_argv("-m", "transforms.engines.vllm_machine.engine", str(self.directory))

    def _spawn(self) -> subprocess.Popen[bytes]:
        sock = self.directory / SOCKET
        if sock.is_symlink() or sock.exists():
            sock.unlink()  # left by a service that died
        fd = self._log_fd()
        with os.fdopen(fd, "ab") as out:
            env = {**service_env(os.environ, sys.path), **dict(self.settings.device_env)}  # pinned to its device
            return subprocess.Popen(self.service_argv(), stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True, close_fds=True)

    def log_path(self) -> Path:
        """Where the service's stdout and stderr go: the run's log file (pipelines/run/run_log.py) when the launcher
        named one that this machine has, else service.log in its private folder (a worker on another host)."""
        named = Path(self.settings.log_file) if self.settings.log_file else None
        return named if named is not None and named.parent.is_dir() else self.directory / "service.log"

    def _log_fd(self) -> int:
        path = self.log_path()
        if path.parent == self.directory:
            return open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

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


def tail_line(path: Path) -> str:
    """The last line of the run's log (the service's last words when it exited at its start)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 4096))
            lines = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return f"no {path.name}"
    return lines[-1][-500:] if lines else f"an empty {path.name}"


def service_settings(settings: VllmMachineSettings) -> dict[str, Any]:
    """The service's settings.json: its VllmLocalSettings' fields, and its device label and simulated engine
    when set (service.py open_service reads them back). Pure."""
    found: dict[str, Any] = asdict(settings.vllm)
    if settings.device:
        found["device"] = settings.device
    if settings.simulated is not None:
        found["simulated"] = asdict(settings.simulated)
    return found


def machine_engine(settings: VllmMachineSettings) -> Any:
    """A worker's engine for `settings` (transforms.engines.make): one service for the machine, or with --devices
    planning several engines on this machine, a DevicePool over one service per device (`device-<i>` folders of
    service_dir, each pinned by its environment). The plan is made here, on the machine the engines run on."""
    if settings.device:
        return VllmMachineEngine(settings)
    from transforms.engines.devices.plan import machine_plan
    from transforms.engines.devices.pool import DevicePool

    plan = machine_plan(settings.devices, settings.vllm.tensor_parallel_size, settings.simulated is not None)
    if len(plan) == 1:
        return VllmMachineEngine(replace(settings, device=plan[0].label, device_env=plan[0].env))
    clients = [VllmMachineEngine(replace(settings, service_dir=str(Path(settings.service_dir) / f"device-{i}"),
                                         device=d.label, device_env=d.env)) for i, d in enumerate(plan)]
    return DevicePool(clients, [d.label for d in plan])


def devices_engine(settings: VllmLocalSettings) -> Any:
    """`--engine vllm_local` on a machine with several devices (a runner's VM of 8 GPUs, whose every SDK process
    sees all of them): the machine's engine service, one engine per device, in a folder named after the run and
    the settings, so every worker process of the VM finds the same engines (its file lock elects the one that
    starts each). None when this machine plans one engine: it stays in the worker's process."""
    from transforms.engines.devices.plan import machine_plan
    from transforms.engines.vllm_machine.folder import service_dir

    if len(machine_plan(settings.devices, settings.tensor_parallel_size)) == 1:
        return None
    machine = VllmMachineSettings(vllm=replace(settings, devices="1", run_key=""),
                                  service_dir=service_dir(settings.run_key, settings), devices=settings.devices)
    return machine_engine(machine)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from transforms.engines.devices.plan import bound_cores

    share = bound_cores(os.environ)
    if share:  # one engine per share of a CPU's cores (--devices N): this process runs on its share only
        os.sched_setaffinity(0, share)
    serve(Path(sys.argv[1]))
