"""What a pagemill child (the render and intake workers, transforms/child_process.py) cannot reach: the secrets of
the processes around it.

The child runs pdfium and Pillow on untrusted bytes, so it is treated as possibly taken over. Its own
environment holds no credentials (child_process.child_env), but the worker above it holds Beam's
PIPELINE_OPTIONS (the S3 keys among them), Beam's `/bin/sh` above that holds the same, and the launcher holds
whatever AWS_* the user set; /proc/<pid>/environ shows each to any process that passes the kernel's ptrace
read check for it. Three layers, each for a case the one before does not cover:

1. `isolate()`, the child's first act: a new user namespace of its own (`unshare(CLONE_NEWUSER)`). The ptrace
   check then needs CAP_SYS_PTRACE in the target's namespace, which the child never has, so it can read no
   process outside it: no ancestor, no sibling worker, as root or not. Files it reads and writes keep their
   owner (its ids are unchanged outside), so its imports, Tesseract and its temp files work as before.
2. Where that is refused (Docker's default seccomp profile, a kernel without unprivileged user namespaces):
   a child with capabilities (root) drops them all, bounding set included; root processes with
   capabilities (every process of a run started as root) are then out of its reach, dumpable or not.
3. Not root and no user namespace: the parent makes itself non-dumpable while it has a child
   (`Undumpable`), which makes its /proc files unreadable to the same uid. This covers the parent only:
   Beam's `/bin/sh` and the launcher above it stay readable then (docs/safety.md). The cost while a child
   lives: no core dump of the parent, and attaching py-spy or gdb to it needs root.

Every layer sets `no_new_privs` first, so nothing the child executes can gain a privilege back.
Linux only; elsewhere each step does nothing.
"""
from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

CLONE_NEWUSER = 0x10000000
PR_GET_DUMPABLE, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 3, 4, 24, 38
CAPABILITY_VERSION_3 = 0x20080522
USER_NAMESPACE, NO_CAPABILITIES, SAME_USER = "user namespace", "no capabilities", "same user"


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)  # the C library the interpreter is linked with (no ldconfig run)


def _raw(name: str, *args: Any) -> int:
    """A libc call's return value; -1 where libc lacks the function (not Linux)."""
    func = getattr(_libc(), name, None)
    return -1 if func is None else int(func(*args))


def _call(name: str, *args: Any) -> int:
    """A libc call: 0 on success, else its errno (ENOSYS where libc lacks it)."""
    if getattr(_libc(), name, None) is None:
        return 38  # ENOSYS
    return 0 if _raw(name, *args) == 0 else ctypes.get_errno()


def unshare_user_namespace() -> int:
    """Move this (single-threaded) process into a new user namespace: 0, or the errno of the refusal."""
    return _call("unshare", CLONE_NEWUSER)


def has_capabilities() -> bool:
    """Whether this process holds any capability (a root process, usually)."""
    header, data = _CapHeader(CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    if _call("capget", ctypes.byref(header), data) != 0:
        return False
    return any(d.effective or d.permitted for d in data)


def drop_capabilities() -> int:
    """Give up every capability: the bounding set first (while CAP_SETPCAP is held), then the effective,
    permitted and inheritable sets. 0, or the errno of capset's refusal."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        _call("prctl", PR_CAPBSET_DROP, cap, 0, 0, 0)  # best effort: without CAP_SETPCAP it is refused
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    return _call("capset", ctypes.byref(header), (_CapData * 2)())


def isolate() -> str:
    """In the child, before it reads anything: no new privileges, then its own user namespace, else no
    capabilities. Returns which layer holds (USER_NAMESPACE, NO_CAPABILITIES, or SAME_USER: then only the
    parent's `Undumpable` protects it)."""
    _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if unshare_user_namespace() == 0:
        return USER_NAMESPACE
    if has_capabilities():
        return NO_CAPABILITIES if drop_capabilities() == 0 else SAME_USER
    return SAME_USER


class Undumpable:
    """The process's dumpable flag, off while any child holds it (a count), back to what it was after the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._saved = 1

    def hold(self) -> None:
        with self._lock:
            if self._holders == 0:
                dumpable = _raw("prctl", PR_GET_DUMPABLE, 0, 0, 0, 0)
                self._saved = dumpable if dumpable >= 0 else 1
                _call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders == 0:
                _call("prctl", PR_SET_DUMPABLE, self._saved, 0, 0, 0)


UNDUMPABLE = Undumpable()  # one per process: the flag is the process's

