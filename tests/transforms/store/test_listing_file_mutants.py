"""A `_LISTED` marker is trusted only when every field checks (a mutant that let a marker of another format
through when its digests matched its waves survived `make mutate`; docs/development.md "Mutation score"): each
marker below is a valid one with one field changed. And `clear_listing` clears (`--force`), and waves of one
object hold one object each."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.records import ListedObject
from transforms.store.listing_file import FORMAT, clear_listing, parse_marker, read_listing, write_listing

OBJECTS = [ListedObject(uri=f"/in/{i}.pdf", size=10 + i, last_modified=1.0) for i in range(5)]
VALID = {"format": FORMAT, "inputs": ["/in/"], "waves": 2, "objects": 3, "bytes": 30, "wave_sha256": ["a", "b"]}


def test_the_valid_marker_is_trusted() -> None:
    listing = parse_marker("f", json.dumps(VALID))
    assert listing.inputs == ("/in/",) and listing.digests == ("a", "b") and listing.waves == 2


@pytest.mark.parametrize("change", [{"format": FORMAT + 1}, {"format": FORMAT - 1}, {"wave_sha256": ["a"]},
                                   {"waves": 3}, {"wave_sha256": ["a", 2]}],
                         ids=["newer-format", "older-format", "a-digest-short", "a-wave-more", "a-digest-not-text"])
def test_a_marker_with_one_field_wrong_binds_nothing(change: dict) -> None:
    listing = parse_marker("f", json.dumps({**VALID, **change}))
    assert listing.inputs is None and listing.folder == "f"  # still says where it lies (the caller reports it)


def test_clear_listing_removes_the_marker_and_every_wave_file(tmp_path: Path) -> None:
    folder = tmp_path / "listing"
    write_listing(str(folder), OBJECTS, 2, ("/in/",))
    assert read_listing(str(folder)) is not None
    clear_listing(str(folder))
    assert read_listing(str(folder)) is None and not list(folder.glob("*"))


def test_one_object_per_wave_gives_a_wave_per_object(tmp_path: Path) -> None:
    assert write_listing(str(tmp_path), OBJECTS, 1, ("/in/",)).waves == len(OBJECTS)
