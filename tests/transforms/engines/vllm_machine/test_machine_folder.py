"""The engine service's private folder (transforms/engines/vllm_machine/folder.py): where it lives, and the refusal of
a folder or file another user could have planted. The owner case is tested as two users: as root the planted
folder is chowned to uid 65534; otherwise os.getuid is made to answer another uid (nothing skips)."""
from __future__ import annotations

import logging
import os
import stat
import tempfile
from pathlib import Path

import pytest

from tests.support.folder_attacks import OTHER_UID, plant_as_other_user, squat
from transforms.engines.vllm_local.settings import VllmLocalSettings
from transforms.engines.vllm_machine import folder as mf

SETTINGS = VllmLocalSettings(model="m", model_revision="r", max_model_len=4096, max_num_seqs=4,
                          gpu_memory_utilization=0.9, tensor_parallel_size=1, limit_mm_per_prompt=1, kv_cache_gib=None,
                          enforce_eager=True)


def private(path: Path) -> Path:
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    return path


def test_the_base_is_a_private_runtime_folder_or_a_per_user_temp_folder(tmp_path: Path) -> None:
    runtime = private(tmp_path / "run-user")
    uid = os.getuid()
    assert mf.private_base({"XDG_RUNTIME_DIR": str(runtime)}, str(tmp_path)) == runtime / "pagemill"
    assert mf.private_base({}, str(tmp_path)) == tmp_path / f"pagemill-{uid}"
    runtime.chmod(0o755)  # a runtime folder others can read is not used
    assert mf.private_base({"XDG_RUNTIME_DIR": str(runtime)}, str(tmp_path)) == tmp_path / f"pagemill-{uid}"
    assert mf.private_base({"XDG_RUNTIME_DIR": "relative"}, str(tmp_path)) == tmp_path / f"pagemill-{uid}"


def test_a_runtime_folder_of_another_user_is_not_the_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = private(tmp_path / "run-user")
    plant_as_other_user(monkeypatch)(runtime)
    assert mf.private_base({"XDG_RUNTIME_DIR": str(runtime)}, str(tmp_path)).parent == tmp_path


def test_every_worker_computes_the_same_folder_inside_the_base(tmp_path: Path) -> None:
    env = {"XDG_RUNTIME_DIR": str(private(tmp_path / "rt"))}
    first = mf.service_dir("run-1", SETTINGS, env)
    assert first == mf.service_dir("run-1", SETTINGS, env)
    assert Path(first).parent == tmp_path / "rt" / "pagemill" and Path(first).name.startswith("engine-")
    assert first != mf.service_dir("run-2", SETTINGS, env)


def test_a_squatted_base_is_announced_and_replaced_by_a_fresh_private_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Fails before the fix: the folder stayed in the squatted base, and every worker refused it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # never the machine's own temp folder
    squatted = tmp_path / f"pagemill-{os.getuid()}"
    why = squat(squatted)
    with caplog.at_level(logging.WARNING, logger=mf.__name__):
        folder = Path(mf.service_dir("run-1", SETTINGS, {}))
    base = folder.parent
    assert base.parent == tmp_path and base != squatted and base.name.startswith(f"pagemill-{os.getuid()}-")
    assert base.stat().st_uid == os.getuid() and stat.S_IMODE(base.stat().st_mode) == 0o700
    said = caplog.text
    assert str(squatted) in said and why in said and str(base) in said
    mf.prepare_folder(folder)  # what a worker does before use, then the service at its start
    mf.check_folder(folder)
    assert list(squatted.iterdir()) == []  # nothing of ours went into the squatter's folder
    again = Path(mf.service_dir("run-1", SETTINGS, {}))
    assert again.parent != base  # random each time: hence decided once, in the launcher's settings


def test_folders_are_created_private(tmp_path: Path) -> None:
    old = os.umask(0)  # even with a permissive umask
    try:
        folder = tmp_path / "base" / "engine-x"
        mf.prepare_folder(folder)
    finally:
        os.umask(old)
    for f in (folder, folder.parent):
        assert stat.S_IMODE(f.lstat().st_mode) == 0o700
    mf.check_folder(folder)


@pytest.mark.parametrize("planted", ["base", "folder"])
def test_a_folder_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str) -> None:
    base = private(tmp_path / "base")
    folder = private(base / "engine-x")
    chown = plant_as_other_user(monkeypatch)
    chown(base if planted == "base" else folder)
    with pytest.raises(mf.FolderRefused, match=f"owned by uid {OTHER_UID}" if os.geteuid() == 0 else "owned by uid"):
        mf.prepare_folder(folder)
    with pytest.raises(mf.FolderRefused):
        mf.check_folder(folder)  # the service's own check at start


@pytest.mark.parametrize("planted", ["base", "folder"])
def test_a_folder_others_can_enter_is_refused(tmp_path: Path, planted: str) -> None:
    base = private(tmp_path / "base")
    folder = private(base / "engine-x")
    (base if planted == "base" else folder).chmod(0o755)
    with pytest.raises(mf.FolderRefused, match="mode 0755"):
        mf.prepare_folder(folder)
    with pytest.raises(mf.FolderRefused, match="mode 0755"):
        mf.check_folder(folder)


@pytest.mark.parametrize("planted", ["base", "folder"])
def test_a_symlink_is_refused_even_to_a_private_folder(tmp_path: Path, planted: str) -> None:
    target = private(tmp_path / "elsewhere")
    base = tmp_path / "base"
    if planted == "base":
        base.symlink_to(target)
    else:
        private(base)
        (base / "engine-x").symlink_to(target)
    with pytest.raises(mf.FolderRefused, match="is a symlink"):
        mf.prepare_folder(base / "engine-x")


def test_the_authkey_is_created_once_private_and_read_back(tmp_path: Path) -> None:
    folder = private(tmp_path / "f")
    assert mf.write_new(folder / "authkey", b"k" * mf.AUTHKEY_BYTES)
    assert not mf.write_new(folder / "authkey", b"j" * mf.AUTHKEY_BYTES)  # O_EXCL: never overwritten
    assert stat.S_IMODE((folder / "authkey").stat().st_mode) == 0o600
    assert mf.read_authkey(folder) == b"k" * mf.AUTHKEY_BYTES


def test_an_authkey_that_is_not_ours_alone_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = private(tmp_path / "f")
    key = folder / "authkey"
    (tmp_path / "theirs").write_bytes(b"k" * mf.AUTHKEY_BYTES)
    key.symlink_to(tmp_path / "theirs")
    with pytest.raises(mf.FolderRefused, match="symlink"):
        mf.read_authkey(folder)
    assert not mf.write_new(key, b"j" * mf.AUTHKEY_BYTES)  # nor written through the link
    assert (tmp_path / "theirs").read_bytes() == b"k" * mf.AUTHKEY_BYTES
    key.unlink()
    key.write_bytes(b"k" * mf.AUTHKEY_BYTES)
    key.chmod(0o644)
    with pytest.raises(mf.FolderRefused, match="mode 0644"):
        mf.read_authkey(folder)
    key.chmod(0o600)
    key.write_bytes(b"short")
    with pytest.raises(mf.FolderRefused, match="5 bytes"):
        mf.read_authkey(folder)
    key.write_bytes(b"k" * mf.AUTHKEY_BYTES)
    plant_as_other_user(monkeypatch)(key)
    with pytest.raises(mf.FolderRefused, match="owned by uid"):
        mf.read_authkey(folder)


def test_the_service_gets_a_minimal_environment() -> None:
    environ = {"PATH": "/usr/bin", "HOME": "/h", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_ACCESS_KEY_ID": "AK",
               "PIPELINE_OPTIONS": '{"s3_secret": "x"}', "GOOGLE_APPLICATION_CREDENTIALS": "/k.json",
               "PAGEMILL_CHECK_VENDOR_KEY": "v", "AZURE_STORAGE_CONNECTION_STRING": "c",
               "VLLM_CPU_KVCACHE_SPACE": "1", "CUDA_VISIBLE_DEVICES": "0", "HF_HUB_OFFLINE": "1",
               "OMP_NUM_THREADS": "2",
               "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LD_PRELOAD": "libtcmalloc.so", "TORCHINDUCTOR_CACHE_DIR": "/c"}
    env = mf.service_env(environ, ["/repo", "", "/venv/site-packages"])
    assert env == {"PATH": "/usr/bin", "HOME": "/h", "PYTHONPATH": os.pathsep.join(["/repo", "/venv/site-packages"]),
                   "VLLM_CPU_KVCACHE_SPACE": "1", "CUDA_VISIBLE_DEVICES": "0", "HF_HUB_OFFLINE": "1",
                   "OMP_NUM_THREADS": "2", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LD_PRELOAD": "libtcmalloc.so",
                   "TORCHINDUCTOR_CACHE_DIR": "/c"}
