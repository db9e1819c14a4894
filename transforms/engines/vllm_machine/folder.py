"""The engine service's folder: private to the user who runs pagemill, checked before every use.

The folder holds the service's socket, its authkey and its settings. Another local user who could create
or replace it would receive the run's prompts and pages and answer in the engine's place, so:
- the base is `$XDG_RUNTIME_DIR/pagemill` when XDG_RUNTIME_DIR is set and private to us, else
  `<tempdir>/pagemill-<uid>`; each service folder is `engine-<key>` inside it (`service_dir`);
- that name is predictable, so another local user can create it first: the launcher then warns and takes a
  fresh private folder (`mkdtemp`, 0700, a random name) as the run's base (`usable_base`), so a squatter can
  neither take over nor stop the engine. The launcher decides the folder once (pipelines/run/settings.py) and
  the workers and the service take it from the run's settings: none of them derives it again;
- a folder is created 0700 and, created or found, checked with lstat before use: a real directory (not a
  symlink), owned by this uid, no group or other bits (`check_private`); the service folder and its parent
  (the base, or the parent of --engine-service-dir) both pass, else `FolderRefused`;
- files in it (authkey, settings, lock) are opened without following symlinks and checked on the open
  descriptor (regular file, owner, mode): nothing is read from a file someone else could have written.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from hashlib import sha256
from pathlib import Path

from transforms.child_process import CHILD_ENV_PREFIXES, child_env
from transforms.engines.vllm_local.settings import VllmLocalSettings

log = logging.getLogger(__name__)
AUTHKEY_BYTES = 32
MAX_SETTINGS_BYTES = 1 << 20
# What vLLM, torch and their libraries read from the environment (transforms/engines/vllm_local/vllm_args.py
# engine_environment; vllm/envs.py): the service gets these and child_env's, nothing else (no storage keys,
# no Beam PIPELINE_OPTIONS).
ENGINE_ENV_KEYS = ("LD_LIBRARY_PATH", "LD_PRELOAD", "USER", "LOGNAME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
                   "LOCAL_RANK", "MAX_JOBS", "NO_COLOR", "DO_NOT_TRACK", "CC", "CXX",
                   "PAGEMILL_FAULT_ENGINE_EXIT")  # service.py FAULT_ENV: a test's fault, never set by pagemill
ENGINE_ENV_PREFIXES = ("VLLM_", "CUDA_", "NVIDIA_", "NCCL_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_",
                       "TORCH", "PYTORCH_", "TRITON_", "OMP_", "MKL_", "KMP_", "ONEDNN_", "DNNL_", "NUMEXPR_",
                       "HIP_", "ROCR_")


class FolderRefused(RuntimeError):
    """The engine service's folder (or a file in it) is not private to this user: nothing in it is used."""


def _refusal(path: Path | str, st: os.stat_result, kind: str) -> str | None:
    """Pure: why `st` (an lstat or fstat result) is not a private `kind` of this user, or None."""
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "directory" else stat.S_ISREG(st.st_mode)
    if not is_kind:
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a real " + kind
        return f"{path} is {what}"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & 0o077:
        return f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: group/other bits set (must be 0700/0600)"
    return None


def check_private(folder: Path) -> None:
    """Refuse `folder` unless it is a real directory (lstat: a symlink is refused), owned by this uid, with no
    group or other permission bits."""
    try:
        st = os.lstat(folder)
    except OSError as err:
        raise FolderRefused(f"engine service folder {folder}: {err.strerror}") from err
    why = _refusal(folder, st, "directory")
    if why is not None:
        raise FolderRefused(f"engine service folder refused: {why}")


def ensure_private(folder: Path) -> None:
    """Create `folder` (0700) if absent, then `check_private` it, created or found."""
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass  # found: checked below like a created one (someone may have planted it)
    except OSError as err:
        raise FolderRefused(f"engine service folder {folder} could not be created: {err.strerror}") from err
    check_private(folder)


def private_base(environ: Mapping[str, str], tempdir: str | None = None) -> Path:
    """Where this user's service folders live: `$XDG_RUNTIME_DIR/pagemill` when that variable names a private
    folder of ours, else `<tempdir>/pagemill-<uid>`. Nothing is created here."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute():
        try:
            if _refusal(runtime, os.lstat(runtime), "directory") is None:
                return Path(runtime) / "pagemill"
        except OSError:
            pass
    return Path(tempdir or tempfile.gettempdir()) / f"pagemill-{os.getuid()}"


def usable_base(environ: Mapping[str, str], tempdir: str | None = None) -> Path:
    """`private_base`, created 0700 when absent; when it is refused (another user made it first, or it is a
    link or open to others), a warning and a fresh private folder `<tempdir>/pagemill-<uid>-<random>` instead.
    Each call on a refused base makes a new folder: call it once per run (the launcher, through the settings)."""
    base = private_base(environ, tempdir)
    try:
        ensure_private(base)
        return base
    except FolderRefused as err:
        fresh = Path(tempfile.mkdtemp(prefix=f"pagemill-{os.getuid()}-", dir=tempdir))  # 0700, ours, unguessable
        check_private(fresh)
        log.warning("%s; this run's engine service uses the private folder %s instead", err, fresh)
        return fresh


def service_dir(run_id: str, settings: VllmLocalSettings, environ: Mapping[str, str] = os.environ) -> str:
    """The run's engine folder on this machine: one engine per run, model and settings, in `usable_base`.
    The launcher calls it once (pipelines/run/settings.py) and every worker process and the service take the
    folder from the run's settings: on a refused base a second call would name another folder."""
    key = sha256(json.dumps([run_id, asdict(settings)], sort_keys=True, default=str).encode()).hexdigest()[:16]
    return str(usable_base(environ) / f"engine-{key}")


def prepare_folder(folder: Path) -> None:
    """Before any use by a worker: the parent (the private base) and the folder, each created 0700 when absent
    and checked. Folders above the parent are created as needed (an --engine-service-dir deep in a new path)."""
    folder.parent.parent.mkdir(parents=True, exist_ok=True)
    ensure_private(folder.parent)
    ensure_private(folder)


def check_folder(folder: Path) -> None:
    """The service's own check at start: its folder and its parent, as the worker checked them."""
    check_private(folder.parent)
    check_private(folder)


def _open(path: Path, flags: int, mode: int = 0o600) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise FolderRefused(f"engine service file refused: {path} is a symlink") from err
        raise


def open_private(path: Path, flags: int) -> int:
    """A file descriptor on `path` in the service folder, opened without following a symlink (created 0600 with
    O_CREAT) and checked on the descriptor: a regular file of ours with no group/other bits."""
    fd = _open(path, flags)
    why = _refusal(path, os.fstat(fd), "file")
    if why is not None:
        os.close(fd)
        raise FolderRefused(f"engine service file refused: {why}")
    return fd


def read_private(path: Path, max_bytes: int) -> bytes:
    """A checked file's bytes (open_private), at most max_bytes (more is refused)."""
    fd = open_private(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FolderRefused(f"engine service file refused: {path} is over {max_bytes} bytes")
    return data


def write_new(path: Path, data: bytes) -> bool:
    """Create `path` 0600 with `data`; False when it exists already (O_EXCL: never written through a planted
    file or link)."""
    try:
        fd = _open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return True


def last_line(path: Path) -> str:
    """A checked file's last line (the service log's: its error, when it exited), for the pages' message."""
    try:
        with os.fdopen(open_private(path, os.O_RDONLY), "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 4096))
            lines = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return f"no {path.name}"
    return lines[-1][-500:] if lines else f"an empty {path.name}"


def read_authkey(folder: Path) -> bytes:
    key = read_private(folder / "authkey", AUTHKEY_BYTES)
    if len(key) != AUTHKEY_BYTES:
        raise FolderRefused(f"engine service file refused: {folder / 'authkey'} holds {len(key)} bytes, "
                            f"not {AUTHKEY_BYTES}")
    return key


def service_env(environ: Mapping[str, str], path: list[str]) -> dict[str, str]:
    """Pure: the engine service's environment: what the render child gets (child_env: what Python needs, the
    import path) but its checks' keys, plus what the engine reads (ENGINE_ENV_KEYS, ENGINE_ENV_PREFIXES); no
    credentials of the worker (HF_TOKEN, for a gated hub model, is the engine's own)."""
    env = {k: v for k, v in child_env(environ, path).items() if not k.startswith(CHILD_ENV_PREFIXES)}
    env.update({k: v for k, v in environ.items() if k in ENGINE_ENV_KEYS or k.startswith(ENGINE_ENV_PREFIXES)})
    return env
