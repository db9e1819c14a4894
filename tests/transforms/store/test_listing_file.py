"""The durable listing records what it was made from (issue 32, findings 1 and 2): `_LISTED` is JSON with the
normalised `--input` and each wave file's sha256; a marker without them (an older pagemill's "waves objects
bytes", or anything not written by pagemill) binds nothing; a wave file changed since is found, and a wave
refuses to read one."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.records import ListedObject
from transforms.store.listing_file import (
    ListingChanged,
    changed_waves,
    parse_marker,
    read_listing,
    wave_rows,
    write_listing,
)

OBJECTS = [ListedObject(uri=f"/in/{i}.pdf", size=10 + i, last_modified=1.0) for i in range(5)]


def test_the_marker_records_inputs_and_each_wave_files_sha256(tmp_path: Path) -> None:
    written = write_listing(str(tmp_path), OBJECTS, 2, ("/in/",))  # waves of 1, 2, 2 (first_wave ramp)
    marker = json.loads((tmp_path / "_LISTED").read_text())
    files = sorted(tmp_path.glob("wave-*.parquet"))
    assert marker["inputs"] == ["/in/"] and marker["waves"] == len(files) == 3 and marker["objects"] == 5
    assert marker["wave_sha256"] == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    assert marker["bytes"] == sum(o.size for o in OBJECTS)
    assert read_listing(str(tmp_path)) == written
    assert not list(tmp_path.glob("*.inprogress"))  # written whole, then renamed
    assert changed_waves(written) == []


@pytest.mark.parametrize("text", ["3 5 60\n", "", "[]", '{"format": 2, "inputs": ["/in/"], "waves": 1}',
                                  '{"format": 2, "inputs": [1], "waves": 1, "objects": 1, "bytes": 1, '
                                  '"wave_sha256": ["a"]}'])
def test_a_marker_without_inputs_and_digests_binds_nothing(text: str) -> None:
    assert parse_marker("f", text).inputs is None


def test_a_rewritten_or_missing_wave_file_is_changed(tmp_path: Path) -> None:
    listing = write_listing(str(tmp_path), OBJECTS, 2, ("/in/",))
    table = pa.Table.from_pylist([{"uri": "/etc/passwd", "size": 1, "last_modified": 1.0}])
    pq.write_table(table, tmp_path / "wave-00001.parquet")
    (tmp_path / "wave-00002.parquet").unlink()
    assert changed_waves(listing) == [1, 2] and changed_waves(listing, [0]) == []
    with pytest.raises(ListingChanged, match="the listing changed"):
        list(wave_rows(listing.wave_file(1), listing.digests[1]))
    assert [r["uri"] for r in wave_rows(listing.wave_file(0), listing.digests[0])] == ["/in/0.pdf"]
