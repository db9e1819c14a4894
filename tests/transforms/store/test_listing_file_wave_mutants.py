"""What a written listing holds, read back with pyarrow and hashlib rather than through the module (mutants that
dropped the wave file's schema, renamed a column, skipped `write_whole`'s rename, changed the manifest record's
keys or counted a zero-byte object as one byte survived `make mutate`; docs/development.md "Mutation score")."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystems import FileSystems

from schemas.records import ListedObject
from transforms.store.listing_file import read_listing, write_listing, write_whole

TIMED = [ListedObject(uri=f"/in/{i}.pdf", size=100 * i, last_modified=1_700_000_000.5 + i) for i in range(3)]


def test_a_wave_file_holds_each_object_uri_size_and_time(tmp_path: Path) -> None:
    write_listing(str(tmp_path), TIMED, 10, ("/in/",))
    rows = pq.read_table(tmp_path / "wave-00000.parquet").to_pylist()
    assert rows == [{"uri": o.uri, "size": o.size, "last_modified": o.last_modified} for o in TIMED]


def test_a_wave_without_times_keeps_the_listing_types(tmp_path: Path) -> None:
    """No object has a time (a store that reports none): the column is still a float column, not Arrow's null
    type, so that every wave file of a listing has the same schema (uri string, size int64, last_modified
    float64, as transforms/store/listing_file.py documents)."""
    write_listing(str(tmp_path), [ListedObject(uri="/in/a.pdf", size=3)], 10, ("/in/",))
    schema = pq.read_schema(tmp_path / "wave-00000.parquet")
    assert [(f.name, f.type) for f in schema] == [("uri", pa.string()), ("size", pa.int64()),
                                                 ("last_modified", pa.float64())]


def test_a_zero_byte_object_adds_no_bytes_but_counts_as_an_object(tmp_path: Path) -> None:
    objects = [ListedObject(uri="/in/empty.pdf", size=0), ListedObject(uri="/in/five.pdf", size=5)]
    listing = write_listing(str(tmp_path), objects, 10, ("/in/",))
    assert (listing.folder, listing.objects, listing.bytes) == (str(tmp_path), 2, 5)
    marker = json.loads((tmp_path / "_LISTED").read_text())
    assert (marker["objects"], marker["bytes"]) == (2, 5)


def test_the_manifest_record_names_the_inputs_and_the_marker_digest(tmp_path: Path) -> None:
    listing = write_listing(str(tmp_path), TIMED, 2, ("/in/",))
    marker = (tmp_path / "_LISTED").read_bytes()
    assert listing.record() == {"inputs": ["/in/"], "sha256": hashlib.sha256(marker).hexdigest()}
    assert read_listing(str(tmp_path)).record() == listing.record()


def test_write_whole_leaves_only_the_file(tmp_path: Path) -> None:
    write_whole(str(tmp_path / "marker"), b"whole\n")
    assert [p.name for p in tmp_path.iterdir()] == ["marker"]
    assert (tmp_path / "marker").read_bytes() == b"whole\n"


def test_a_write_cut_before_its_rename_leaves_no_file_under_the_name(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill between writing and renaming (injected: the rename fails) must leave no `_LISTED`: a reader
    would take a half-written marker for a whole listing."""
    def killed(*_: object) -> None:
        raise OSError("killed before the rename")

    monkeypatch.setattr(FileSystems, "rename", killed)
    with pytest.raises(OSError):
        write_whole(str(tmp_path / "_LISTED"), b"{}\n")
    assert not (tmp_path / "_LISTED").exists()
    assert read_listing(str(tmp_path)) is None
