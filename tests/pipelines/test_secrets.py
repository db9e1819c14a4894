"""Storage credentials reach Beam and its workers as pipeline options, never the process environment, the
manifest, the output, or a child that does not need them (Tesseract)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.config.storage import StorageConfig, command_line_secrets, configure
from tests.support import docmaker
from tests.support.child_probe import DIR_VAR, SECRET_VAR
from transforms.hints.ocr import tesseract_env

SECRET = "pagemill-test-secret-0f3c9a7e51"


def test_tesseract_env_is_minimal() -> None:
    worker = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "TESSDATA_PREFIX": "/t", "AWS_SECRET_ACCESS_KEY": SECRET,
              "PIPELINE_OPTIONS": json.dumps({"s3_secret_access_key": SECRET}), "HF_TOKEN": "hf_x"}
    env = tesseract_env(worker)
    assert env == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "TESSDATA_PREFIX": "/t", "OMP_THREAD_LIMIT": "1"}


def test_configure_writes_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    before = dict(os.environ)
    configure(StorageConfig(s3_endpoint_url="http://127.0.0.1:9", s3_region="us-east-1",
                            s3_access_key_id="AKIAFAKE", s3_secret_access_key=SECRET))
    assert dict(os.environ) == before
    assert SECRET not in repr(StorageConfig(s3_secret_access_key=SECRET))


def _fake_tesseract(folder: Path, dumps: Path) -> None:
    """Fault injection: a `tesseract` that records the environment it was given, then fails."""
    script = folder / "tesseract"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "--list-langs" ]; then echo "List of available languages (1):"; echo eng; exit 0; fi
env > "{dumps}/env-$$.txt"
exit 1
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_secret_stays_out_of_children_manifest_and_output(tmp_path: Path) -> None:
    """Also from inside the render child (a --safety-check that probes, tests/support/child_probe.py): the
    environment of its worker (PIPELINE_OPTIONS, the keys among them), of Beam's shell and of the launcher (the
    secret planted there too) cannot be read. That part fails before the fix: the worker's was readable."""
    pytest.importorskip("moto")
    from tests.support.moto_s3 import client, make_bucket, start_moto, stop_moto

    proc, endpoint = start_moto()
    try:
        s3 = {"endpoint": endpoint, "key": "AKIAFAKEFAKEFAKE", "secret": SECRET, "region": "us-east-1"}
        make_bucket(s3, "sec", {"in/scan.png": docmaker.scanned_png(), "in/doc.pdf": docmaker.multipage_pdf(1)})
        bin_dir, dumps, probes = tmp_path / "bin", tmp_path / "dumps", tmp_path / "probes"
        for folder in (bin_dir, dumps, probes):
            folder.mkdir()
        _fake_tesseract(bin_dir, dumps)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(PATH=f"{bin_dir}:{env['PATH']}", AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
                   AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_EC2_METADATA_DISABLED="true",
                   PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        env.update({SECRET_VAR: SECRET, DIR_VAR: str(probes)})  # in the launcher's environment, and the probe's
        args = ["run", "--input", "s3://sec/in/", "--output", "s3://sec/out", "--run-id", "sec", "--extract", "false",
                "--hints", "ocr", "--nsfw-classifier", "none", "--progress-every-s", "0",
                "--s3-endpoint-url", endpoint, "--s3-region", "us-east-1",
                "--s3-access-key-id", s3["key"], "--s3-secret-access-key", SECRET,
                "--direct_running_mode=multi_processing", "--direct_num_workers=2",
                "--safety-check", "tests.support.child_probe:ProbeCheck"]
        run = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        said = run.stdout + run.stderr
        assert SECRET not in said, said[max(0, said.find(SECRET) - 400): said.find(SECRET) + 100]
        manifest = client(s3).get_object(Bucket="sec", Key="out/runs/tenant=default/sec.json")["Body"].read().decode()
        assert json.loads(manifest)["documents"] == 2
        assert SECRET not in manifest and s3["key"] not in manifest
        seen = sorted(dumps.glob("env-*.txt"))
        assert seen, "Tesseract never ran: the check below would prove nothing"
        for dump in seen:
            text = dump.read_text()
            assert SECRET not in text and "PIPELINE_OPTIONS" not in text and "AWS_" not in text
            assert "OMP_THREAD_LIMIT=1" in text
        probed = [json.loads(f.read_text()) for f in sorted(probes.glob("probe-*.json"))]
        assert probed, "no render child ran the probe: the check below would prove nothing"
        for _, *above in probed:  # its own line first, then each process above it
            assert len(above) >= 3, above  # its worker, Beam's shell, the launcher (and what started them)
            assert all(what != "secret" for _, _, what in above), above
            assert above[0][2].startswith("refused"), above
    finally:
        stop_moto(proc)


def test_keys_on_the_command_line_are_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Fails before the fix: the keys sat in the world-readable command line with no word said.
    assert command_line_secrets(["--s3-secret-access-key", SECRET, "--s3_session_token=t", "--s3-region", "x"]) == \
        ["--s3-secret-access-key", "--s3-session-token"]
    assert command_line_secrets(["--s3-profile", "p", "--output", "--s3-access-key-id-file"]) == []
    assert cli.main(["sql", "--output", str(tmp_path), "--s3-access-key-id", "AKIAFAKE", "--s3-secret-access-key",
                     SECRET, "SELECT 1"]) == 0
    err = capsys.readouterr().err
    assert "warning: --s3-access-key-id, --s3-secret-access-key on the command line can be read by every" in err
    assert "AWS_SECRET_ACCESS_KEY in the environment or as --s3-profile" in err and SECRET not in err
