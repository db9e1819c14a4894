"""The launcher's up-front check of a reused listing (pipelines/run/waves.py `bound_listing`, issue 43): every wave
file is checked against its recorded sha256 before the first wave runs, not only the wave about to run, so a
rewritten *last* wave stops the resume before any wave writes a row (exit 2). A listing written with
transforms/store/listing_file.py into a temporary folder; no pipeline runs."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.run.waves import bound_listing
from schemas import layout
from schemas.records import ListedObject
from transforms.store.listing_file import mark_done, write_listing

RUN, TENANT = "r1", "acme"


def options(tmp_path: Path, inputs: list[str]) -> SimpleNamespace:
    return SimpleNamespace(wave_objects=2, force=False, output=str(tmp_path / "out"), tenant=TENANT, run_id=RUN,
                           input=inputs)


def listed(tmp_path: Path) -> tuple[SimpleNamespace, str]:
    """Five objects under `in/`, listed in waves of 2: the first wave is a tenth of 2 (at least 1 object), then
    2 and 2: three wave files."""
    folder = tmp_path / "in"
    folder.mkdir()
    objects = []
    for i in range(5):
        (folder / f"doc{i}.png").write_bytes(b"x" * (i + 1))
        objects.append(ListedObject(str(folder / f"doc{i}.png"), i + 1, 1.0))
    o = options(tmp_path, [str(folder) + "/"])
    listing_folder = layout.listing_folder(o.output, TENANT, RUN)
    Path(listing_folder).mkdir(parents=True)
    written = write_listing(listing_folder, objects, 2, [str(folder) + "/"])
    assert written.waves == 3
    return o, listing_folder


def test_an_unchanged_listing_is_reused(tmp_path: Path) -> None:
    o, _ = listed(tmp_path)
    listing, problems = bound_listing(o)
    assert problems == [] and listing is not None and (listing.waves, listing.objects) == (3, 5)


@pytest.mark.parametrize("wave", [2, 1])
def test_a_later_wave_rewritten_refuses_the_resume_before_the_first_wave(tmp_path: Path, wave: int) -> None:
    """The rewritten file is a valid wave file naming an object outside `--input`."""
    o, listing_folder = listed(tmp_path)
    planted = pa.Table.from_pylist([{"uri": "/etc/passwd", "size": 10, "last_modified": 1.0}],
                                   schema=pa.schema([("uri", pa.string()), ("size", pa.int64()),
                                                     ("last_modified", pa.float64())]))
    pq.write_table(planted, f"{listing_folder}/wave-{wave:05d}.parquet")
    listing, problems = bound_listing(o)
    assert listing is None and len(problems) == 1
    assert f"wave-{wave:05d}.parquet" in problems[0] and "wave-00000.parquet" not in problems[0]


def test_a_later_wave_file_gone_refuses_the_resume(tmp_path: Path) -> None:
    o, listing_folder = listed(tmp_path)
    Path(f"{listing_folder}/wave-00002.parquet").unlink()
    listing, problems = bound_listing(o)
    assert listing is None and len(problems) == 1 and "wave-00002.parquet" in problems[0]


def test_a_wave_marked_done_is_done_and_only_it(tmp_path: Path) -> None:
    o, listing_folder = listed(tmp_path)
    mark_done(listing_folder, 1)
    listing, _ = bound_listing(o)
    assert listing is not None and [listing.done(w) for w in range(3)] == [False, True, False]
    assert sorted(p.name for p in Path(listing_folder).iterdir() if p.suffix == ".done") == ["wave-00001.done"]
