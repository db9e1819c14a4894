"""A listing belongs to its run (issue 32, findings 1 and 2), end to end (render-only, no model): a listing
planted under the tenant's own prefix for a predictable run id, a wave file rewritten after a killed run and a
resume with other `--input` each leave no row for an object outside `--input` read, and say why: exit 2, or a
`rejected` row `outside_input` (never read); on a local folder and on S3 (moto)."""
from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import cli
from pipelines.run import graph
from tests.support.moto_s3 import client, docs, flags, make_bucket, start_moto, stop_moto
from tests.support.raw import raw_rows
from tests.support.wave_inputs import RENDER_ONLY, png

RUN = "nightly-2026-12-03"  # a predictable run id: a scheduled job's date


def wave_bytes(uris: list[str], size: int = 100) -> bytes:
    """A wave file as an attacker writes one (the listing's Parquet columns)."""
    table = pa.Table.from_pylist([{"uri": u, "size": size, "last_modified": 1.0} for u in uris],
                                 schema=pa.schema([("uri", pa.string()), ("size", pa.int64()),
                                                   ("last_modified", pa.float64())]))
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def bound_marker(inputs: list[str], waves: list[bytes], objects: int) -> bytes:
    """A `_LISTED` that records the victim's own inputs and the planted files' true digests: all a tenant
    with write access to its prefix can compute."""
    return json.dumps({"format": 2, "inputs": inputs, "waves": len(waves), "objects": objects, "bytes": 100,
                       "wave_sha256": [hashlib.sha256(w).hexdigest() for w in waves]}).encode()


@pytest.fixture
def tenants(tmp_path: Path) -> dict[str, Path]:
    """alpha's uploads, bravo's confidential file, alpha_in2 (a prefix trick) and a system file."""
    paths = {"alpha": tmp_path / "alpha_in" / "alpha-own.png", "bravo": tmp_path / "bravo_in" / "bravo-secret.png",
             "alpha2": tmp_path / "alpha_in2" / "near.png", "system": tmp_path / "etc" / "passwd"}
    for i, path in enumerate(paths.values()):
        path.parent.mkdir(parents=True)
        path.write_bytes(png(i + 1))
    return paths


def run(inputs: list[str], output: Path | str, *extra: str) -> int:
    args = ["run", "--output", str(output), "--run-id", RUN, "--tenant", "alpha", "--progress-every-s", "0",
            "--wave-objects", "2", *RENDER_ONLY, *extra]
    for given in inputs:
        args += ["--input", given]
    return cli.main(args)


def listing_folder(output: Path) -> Path:
    return output / "listings" / "tenant=alpha" / f"run_id={RUN}"


def test_a_planted_legacy_listing_is_not_trusted(tmp_path: Path, tenants: dict[str, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The listing format before this fix ("waves objects bytes"), naming bravo's file and a system file."""
    output = tmp_path / "out"
    folder = listing_folder(output)
    folder.mkdir(parents=True)
    (folder / "wave-00000.parquet").write_bytes(wave_bytes([str(tenants["bravo"]), str(tenants["system"])]))
    (folder / "_LISTED").write_text("1 2 200\n")
    assert run([str(tmp_path / "alpha_in")], output) == 2
    err = capsys.readouterr().err
    assert "not trusted" in err and "--force" in err
    assert raw_rows(output, "documents") == []


def test_a_planted_bound_listing_reads_nothing_outside_input(tmp_path: Path, tenants: dict[str, Path]) -> None:
    """A listing with the victim's inputs recorded and true digests: every URI outside --input is a
    `rejected` `outside_input` row, never read (no hash, no page); inside ones are read as listed."""
    output = tmp_path / "out"
    folder = listing_folder(output)
    folder.mkdir(parents=True)
    sneaky = [str(tenants["bravo"]), str(tmp_path / "alpha_in" / ".." / "bravo_in" / "bravo-secret.png")]
    waves = [wave_bytes([str(tenants["alpha"]), str(tenants["alpha2"]), *sneaky, str(tenants["system"])])]
    (folder / "wave-00000.parquet").write_bytes(waves[0])
    (folder / "_LISTED").write_bytes(bound_marker([f"{tmp_path}/alpha_in/"], waves, 5))
    assert run([str(tmp_path / "alpha_in")], output) == 0
    rows = {r["source_uri"]: r for r in raw_rows(output, "documents", RUN)}
    assert len(rows) == 5
    outside = [str(tenants["alpha2"]), *sneaky, str(tenants["system"])]
    assert {u: (rows[u]["outcome"], rows[u]["reason_code"], rows[u]["doc_sha256"]) for u in outside} == {
        u: ("rejected", "outside_input", None) for u in outside}
    assert rows[str(tenants["alpha"])]["outcome"] == "rendered"
    assert [p["source_uri"] for p in raw_rows(output, "pages", RUN)] == [str(tenants["alpha"])]


def on_first_wave(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """`action` runs as the first wave's pipeline is built; a second wave's build dies (a kill, as the resume
    sees it: the first wave is marked done, the second not)."""
    build, calls = graph.build_pipeline, []

    def builder(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed")
        action()
        build(*args, **kwargs)

    monkeypatch.setattr(graph, "build_pipeline", builder)


def three_uploads(tmp_path: Path) -> list[Path]:
    uploads = [tmp_path / "alpha_in" / f"a{i}.png" for i in range(3)]
    for i, path in enumerate(uploads):
        path.write_bytes(png(10 + i))
    return uploads


def test_a_wave_file_rewritten_after_a_kill_stops_the_resume(tmp_path: Path, tenants: dict[str, Path],
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    three_uploads(tmp_path)  # 4 objects in waves of 1, 2, 1
    output = tmp_path / "out"
    with monkeypatch.context() as m:
        on_first_wave(m, lambda: None)
        assert run([str(tmp_path / "alpha_in")], output) == 1
    folder = listing_folder(output)
    assert (folder / "wave-00000.done").exists() and not (folder / "wave-00001.done").exists()
    (folder / "wave-00001.parquet").write_bytes(wave_bytes([str(tenants["bravo"]), str(tenants["system"])]))
    capsys.readouterr()
    assert run([str(tmp_path / "alpha_in")], output) == 2
    err = capsys.readouterr().err
    assert "the listing changed" in err and "wave-00001.parquet" in err
    assert not {r["source_uri"] for r in raw_rows(output, "documents", RUN)} & {str(tenants["bravo"]),
                                                                             str(tenants["system"])}


def test_a_wave_file_rewritten_while_the_run_goes_on_is_not_read(tmp_path: Path, tenants: dict[str, Path],
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Rewritten after the run checked its listing, during the first wave: the second wave is checked again."""
    three_uploads(tmp_path)
    output = tmp_path / "out"
    planted = wave_bytes([str(tenants["bravo"])])
    on_first_wave(monkeypatch, lambda: (listing_folder(output) / "wave-00001.parquet").write_bytes(planted))
    assert run([str(tmp_path / "alpha_in")], output) == 2
    assert "the listing changed" in capsys.readouterr().err
    assert str(tenants["bravo"]) not in {r["source_uri"] for r in raw_rows(output, "documents", RUN)}


def test_a_different_input_on_resume_exits_2_naming_both(tmp_path: Path, tenants: dict[str, Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out"
    assert run([str(tmp_path / "alpha_in")], output) == 0
    capsys.readouterr()
    assert run([str(tmp_path / "bravo_in")], output) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}/alpha_in/" in err and f"{tmp_path}/bravo_in/" in err
    assert [r["source_uri"] for r in raw_rows(output, "documents", RUN)] == [str(tenants["alpha"])]
    m = json.loads((output / "runs" / "tenant=alpha" / f"{RUN}.json").read_text())
    assert m["listing"]["inputs"] == [f"{tmp_path}/alpha_in/"]  # the listing the rows came from


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    proc, endpoint = start_moto()
    yield {"endpoint": endpoint, "key": "testing", "secret": "testing", "region": "us-east-1"}
    stop_moto(proc)


def test_on_s3_a_planted_listing_reads_nothing_outside_and_other_inputs_exit_2(
        s3: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    bucket = "shared"
    make_bucket(s3, bucket, {"alpha_in/own.png": png(1), "bravo_in/bravo-confidential.png": png(2),
                             "alpha_in2/near.png": png(3)})
    outside = [f"s3://{bucket}/bravo_in/bravo-confidential.png", f"s3://{bucket}/alpha_in2/near.png",
               f"s3://{bucket}/alpha_in/../bravo_in/bravo-confidential.png"]
    waves = [wave_bytes([f"s3://{bucket}/alpha_in/own.png", *outside])]
    prefix = f"out/listings/tenant=alpha/run_id={RUN}/"
    client(s3).put_object(Bucket=bucket, Key=prefix + "wave-00000.parquet", Body=waves[0])
    client(s3).put_object(Bucket=bucket, Key=prefix + "_LISTED",
                          Body=bound_marker([f"s3://{bucket}/alpha_in/"], waves, 4))
    output = f"s3://{bucket}/out"
    assert run([f"s3://{bucket}/alpha_in/"], output, *flags(s3)) == 0
    rows = {r["source_uri"]: r for r in docs(output, s3)}
    assert {u: (rows[u]["outcome"], rows[u]["reason_code"], rows[u]["doc_sha256"]) for u in outside} == {
        u: ("rejected", "outside_input", None) for u in outside}
    assert rows[f"s3://{bucket}/alpha_in/own.png"]["outcome"] == "rendered" and len(rows) == 4
    capsys.readouterr()
    assert run([f"s3://{bucket}/bravo_in/"], output, *flags(s3)) == 2
    err = capsys.readouterr().err
    assert f"s3://{bucket}/alpha_in/" in err and f"s3://{bucket}/bravo_in/" in err
