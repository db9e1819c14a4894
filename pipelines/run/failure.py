"""The one line that says why a run failed (the launcher's, pipelines/run/run.py)."""
from __future__ import annotations

import errno
import os
import re

from pipelines.run.pool_watch import WorkerPoolLost


def run_failure(err: BaseException) -> str:
    """One line for a run that failed: what went wrong at its root, in words. Pure. Runners wrap a
    DoFn's exception (in-process as its __cause__, across processes only as text), so both are read."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for exc in chain:
        if isinstance(exc, WorkerPoolLost):  # the launcher's own verdict, above the runner's "CANCELLED"
            return f"{type(exc).__name__}: {exc}"[:300]
        if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
            where = f" ({exc.filename})" if exc.filename else ""
            return f"{_STORAGE_ERRNOS[exc.errno]}{where}"
    text = " ".join(str(e) for e in chain)
    for code, words in _STORAGE_ERRNOS.items():
        if f"[Errno {code}]" in text or os.strerror(code) in text:
            return words
    root = chain[-1]
    raised = _RAISED.findall(str(root)) if _TRACEBACK in str(root) else []
    if raised:  # a worker process's traceback as text: its last exception line says what happened
        return raised[-1].strip()[:300]
    first = (str(root).strip().splitlines() or [""])[0]
    return f"{type(root).__name__}: {first}"[:300]


_TRACEBACK = "Traceback (most recent call last)"
_RAISED = re.compile(r"^\s*((?:\w+\.)*\w*(?:Error|Exception|Exit|Interrupt)\b.*)$", re.MULTILINE)

_STORAGE_ERRNOS = {errno.ENOSPC: "no space left on the output's storage",
                   errno.EDQUOT: "the output's storage quota is exhausted",
                   errno.EROFS: "the output's storage is read-only"}
