"""A pagemill child cannot read the environment of the processes above it (transforms/child_sandbox.py), tested
from inside a ChildWorker's child (the render and intake workers' plumbing): a launcher process holds a secret in
its environment and asks its child to read /proc/<pid>/environ of every ancestor (tests/support/child_probe.py).

Each layer is tested where it is the one that holds: the child's own user namespace; where a seccomp filter or
the kernel refuses that (a sitecustomize in the child makes `unshare` fail, the fault injected), a root child
without capabilities; and a parent without privileges (uid 0 kept, every capability dropped: the kernel then
treats parent and child as one ordinary user) that is non-dumpable while its child lives."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transforms.child_process import python_argv

SECRET = "pagemill-planted-parent-secret-5d1e"
ROOT = str(Path(__file__).resolve().parents[2])
LAUNCHER = """
import ctypes, json, os, sys
from transforms import child_sandbox
from transforms.child_process import ChildWorker
from tests.support.child_probe import probe

libc = ctypes.CDLL(None, use_errno=True)
if sys.argv[1] == "unprivileged":
    assert child_sandbox.drop_capabilities() == 0
if sys.argv[2] == "refused":
    sys.path.insert(0, sys.argv[3])  # the child's import path: its sitecustomize refuses unshare
worker = ChildWorker(probe)
items, why, detail = worker.ask((os.environ["AWS_SECRET_ACCESS_KEY"],), 120)
during = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
worker.stop()
print(json.dumps({"items": items, "why": why, "detail": detail, "dumpable": [during, libc.prctl(3, 0, 0, 0, 0)],
                  "caps": [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff:")][0]}))
"""
REFUSE_UNSHARE = """import transforms.child_sandbox as sandbox
sandbox.unshare_user_namespace = lambda: 1  # EPERM, as Docker's default seccomp profile answers
"""
FULL_MAP = "0 0 4294967295"  # the initial user namespace's uid_map


def user_namespaces_allowed() -> bool:
    """Whether this machine lets a process make a user namespace (measured in a throwaway process)."""
    code = "import ctypes, os; os._exit(0 if ctypes.CDLL(None).unshare(0x10000000) == 0 else 1)"
    return subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def launch(tmp_path: Path, parent: str, unshare: str) -> dict:
    (tmp_path / "sitecustomize.py").write_text(REFUSE_UNSHARE)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": ROOT, "AWS_SECRET_ACCESS_KEY": SECRET}
    run = subprocess.run(python_argv("-c", LAUNCHER, parent, unshare, str(tmp_path)), env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("unshare", ["allowed", "refused"])
@pytest.mark.parametrize("parent", ["as started", "unprivileged"])
def test_the_child_reads_no_ancestors_environment(tmp_path: Path, parent: str, unshare: str) -> None:
    """Fails before the fix: the child read its parent's environment, secret and all."""
    seen = launch(tmp_path, parent, unshare)
    assert seen["why"] is None, seen["detail"]
    (_, uid_map, child_caps), *above = seen["items"]
    assert above and above[0][1].startswith("python"), above  # the launcher, then whatever started it
    assert all(what != "secret" for _, _, what in above), above
    assert above[0][2].startswith("refused"), above  # the parent's own environment: not even readable
    if unshare == "refused":
        assert uid_map == FULL_MAP  # the fault took: no namespace of its own, the other layers held
        assert int(child_caps, 16) == 0  # a root child gave up its capabilities (any other had none)
    elif user_namespaces_allowed():
        assert uid_map != FULL_MAP  # its own namespace
    if parent == "unprivileged":
        assert int(seen["caps"], 16) == 0
    assert seen["dumpable"] == [0, 1]  # non-dumpable while the child lived, as before once it is gone


def test_the_parent_is_dumpable_again_only_when_its_last_child_is_gone() -> None:
    from transforms.child_sandbox import Undumpable

    libc = ctypes.CDLL(None)
    before = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE (another test's child may still hold it off)
    libc.prctl(4, 1, 0, 0, 0)
    flag = Undumpable()
    try:
        flag.hold()
        flag.hold()
        assert libc.prctl(3, 0, 0, 0, 0) == 0
        flag.release()
        assert libc.prctl(3, 0, 0, 0, 0) == 0  # one child still lives
        flag.release()
        assert libc.prctl(3, 0, 0, 0, 0) == 1
        flag.release()  # one too many: ignored
        assert libc.prctl(3, 0, 0, 0, 0) == 1
    finally:
        libc.prctl(4, before, 0, 0, 0)
