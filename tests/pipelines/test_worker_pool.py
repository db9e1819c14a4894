"""pipelines/run/worker_pool.py: Beam's worker pool, listening only where the user says (loopback by default).
What is listening is read from the kernel's socket tables (/proc/net/tcp, tcp6), and Beam's own pool is read the
same way, so the check is seen to tell "every interface" from "loopback"."""
from __future__ import annotations

import ipaddress
from pathlib import Path

import grpc
import pytest
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc
from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

from pipelines.run import worker_pool

LISTEN = "0A"


def listening(port: int) -> set[str]:
    """The local addresses of the sockets listening on `port`."""
    found = set()
    for table in ("tcp", "tcp6"):
        path = Path("/proc/net") / table
        for line in path.read_text().splitlines()[1:] if path.exists() else []:
            local, state = line.split()[1], line.split()[3]
            address, _, hexport = local.partition(":")
            if state == LISTEN and int(hexport, 16) == port:
                raw = bytes.fromhex(address)
                # the kernel prints each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(raw)
                found.add(str(getattr(ip, "ipv4_mapped", None) or ip))  # gRPC listens on ::ffff:127.0.0.1
    return found


def test_the_pool_listens_on_loopback_only_by_default() -> None:
    assert worker_pool.DEFAULT_BIND.startswith("127.0.0.1:")
    port, server = worker_pool.start("127.0.0.1:0")
    try:
        assert listening(port) == {"127.0.0.1"}
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # the pool answers there
            stub = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channel)
            stub.StopWorker(beam_fn_api_pb2.StopWorkerRequest(worker_id="none"), timeout=10)
    finally:
        server.stop(0)


def test_beams_own_pool_listens_on_every_interface() -> None:
    """Why the module exists: the same servicer started by Beam binds `[::]`, every address of the host."""
    address, server = BeamFnExternalWorkerPoolServicer.start(port=0)
    try:
        assert listening(int(address.rsplit(":", 1)[1])) & {"::", "0.0.0.0"}
    finally:
        server.stop(0)


@pytest.mark.parametrize("bind", ["50000", "host:", "127.0.0.1:70000", ":1"])
def test_a_bind_that_is_not_host_port_is_a_usage_error(bind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert worker_pool.main(["--bind", bind]) == 2
    assert "HOST:PORT" in capsys.readouterr().err


def test_loopback_is_told_from_other_addresses() -> None:
    assert worker_pool.is_loopback("127.0.0.1") and worker_pool.is_loopback("::1")
    assert worker_pool.is_loopback("localhost")
    assert not worker_pool.is_loopback("0.0.0.0") and not worker_pool.is_loopback("10.0.0.2")
    assert worker_pool.parse_bind("[::1]:50000") == ("::1", 50000)
