"""The manifest's options (pipelines/tables/manifest.py manifest_options): pagemill's own options and the Beam
flags given, never Beam's other defaults nor a credential; the manifest file read with any content (a reason
for each malformed kind, never an exception) and written whole or not at all (transforms/store/manifest_file.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from apache_beam.io.filesystems import FileSystems

from pipelines.config.options import PagemillOptions, own_option_names
from pipelines.tables.manifest import manifest_options, write_manifest
from tests.support.disk_faults import FullDisk
from transforms.store import manifest_file

SECRET = "pagemill-test-secret-manifest"


def test_pagemill_options_and_the_beam_flags_given_only() -> None:
    options = PagemillOptions(["--input", "in/", "--output", "out/", "--dpi", "200", "--direct_num_workers", "3",
                               "--job_name", "nightly", "--s3_secret_access_key", SECRET,
                               f"--azure_connection_string=AccountName=a;AccountKey={SECRET}-azure"])
    recorded = manifest_options(options)
    # pagemill's own options and, of Beam's, only the two this command line gave (not a count to keep raising).
    assert set(recorded) - own_option_names() == {"direct_num_workers", "job_name"}, sorted(recorded)
    assert own_option_names() <= set(recorded)  # every pagemill option, defaults included
    assert (recorded["dpi"], recorded["direct_num_workers"], recorded["job_name"]) == (200, 3, "nightly")
    # Beam defaults that this run did not set: a Dataflow endpoint, a Flink master, the runner.
    assert not {"dataflow_endpoint", "flink_master", "runner", "direct_running_mode"} & set(recorded)
    assert SECRET not in repr(recorded) and "s3_secret_access_key" not in recorded
    assert "azure_connection_string" not in recorded  # it carries the storage account's key
    # Beam has far more options than the manifest records.
    assert len(options.get_all_options(drop_default=False)) > 2 * len(recorded)


def test_passwords_in_urls_are_not_recorded() -> None:
    options = PagemillOptions(["--input", "s3://in/", "--input", "https://tok3n-abc@files.example.com/in/",
                               "--output", "out/", "--engine", "openai", "--model", "m",
                               "--endpoint", f"http://pagemill:{SECRET}@gpu-7:8000/v1"])
    recorded = manifest_options(options)
    assert recorded["endpoint"] == "http://pagemill:***@gpu-7:8000/v1"  # whose, and where: kept
    assert recorded["input"] == ["s3://in/", "https://***@files.example.com/in/"]  # a lone user part may be a key
    assert SECRET not in repr(recorded) and "tok3n" not in repr(recorded)


# Manifests a tenant's folder can hold (transforms/store/manifest_file.py): each is skipped with a reason.
GOOD = {"run_id": "r1", "tenant": "acme", "started_at": "2026-03-01T10:00:00+00:00", "wall_seconds": 2.5,
        "documents": 3, "totals": {"pages": 4, "model_calls": 2, "cost_usd": 0.01, "api_equivalent_usd": 0.1},
        "options": {"tenant": "acme", "schema": "invoice", "job_name": "nightly"},
        "stage_timings": {"render_ms": {"count": 4, "sum": 120, "mean": 30.0, "max": 50}}}
MALFORMED = {
    "a list": (b"[]", "the manifest is a list, not an object"),
    "truncated": (json.dumps(GOOD).encode()[:40], "not JSON"),
    "empty": (b"", "not JSON"),
    "not UTF-8": (b'{"run_id": "\xff\xfe"}', "not JSON"),
    "nested past reason": (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    "a string count": (json.dumps({**GOOD, "documents": "3"}).encode(), "the manifest.documents is a string"),
    "a boolean count": (json.dumps({**GOOD, "documents": True}).encode(), "the manifest.documents is a boolean"),
    "a count past BIGINT": (json.dumps({**GOOD, "documents": 2 ** 64}).encode(), "documents is out of range"),
    "totals a list": (json.dumps({**GOOD, "totals": [1]}).encode(), "the manifest.totals is a list"),
    "a cost as text": (json.dumps({**GOOD, "totals": {"cost_usd": "$1"}}).encode(), "totals.cost_usd is a string"),
    "options a string": (json.dumps({**GOOD, "options": "x"}).encode(), "the manifest.options is a string"),
    "a schema list": (json.dumps({**GOOD, "options": {"schema": ["a"]}}).encode(), "options.schema is a list"),
    "a start that is no time": (json.dumps({**GOOD, "started_at": "yesterday"}).encode(),
                                "started_at is not an ISO 8601 time"),
    "a render time without its sum": (json.dumps({**GOOD, "stage_timings": {"render_ms": {"count": 1}}}).encode(),
                                      "render_ms lacks sum"),
    "too large": (b" " * (4 * 1024 * 1024) + b"{}", "larger than 4194304 bytes"),
}


def test_a_manifest_as_pagemill_run_writes_it_parses() -> None:
    assert manifest_file.parse(json.dumps(GOOD).encode()) == (GOOD, None)
    assert manifest_file.parse(b"{}") == ({}, None)  # every field may be missing: old manifests lack some
    assert manifest_file.parse(json.dumps({**GOOD, "documents": None, "extra": [1]}).encode())[1] is None


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_manifest_is_a_reason_not_an_exception(kind: str) -> None:
    data, reason = MALFORMED[kind]
    manifest, why = manifest_file.parse(data)
    assert manifest is None and why is not None and reason in why, why


class _FailsHalfway:
    """A fault injector: the next `.json` file created gets half of what is written, then ENOSPC."""

    def __init__(self, real: Any) -> None:
        self.real, self.armed = real, True

    def __call__(self, path: str, *args: Any, **kwargs: Any) -> Any:
        handle = self.real(path, *args, **kwargs)
        if not self.armed or ".json" not in path:
            return handle
        self.armed = False
        return FullDisk(handle, path)


def test_an_interrupted_manifest_write_leaves_the_old_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails before the fix: the manifest was written in place, so a write cut short (a full disk here) left
    half a file that every later `pagemill sql`, report and `--since-last-run` of the tenant read."""
    out = str(tmp_path / "out")
    uri = write_manifest(out, "acme", "r1", GOOD)
    old = Path(uri).read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(FileSystems, "create", _FailsHalfway(FileSystems.create))
        with pytest.raises(OSError, match="No space left"):
            write_manifest(out, "acme", "r1", {**GOOD, "documents": 4})
    assert Path(uri).read_bytes() == old
    assert [p.name for p in Path(uri).parent.iterdir()] == ["r1.json"]  # no temporary file left behind
    write_manifest(out, "acme", "r1", {**GOOD, "documents": 5})  # room again: replaced whole
    assert json.loads(Path(uri).read_text())["documents"] == 5
    assert [p.name for p in Path(uri).parent.iterdir()] == ["r1.json"]
