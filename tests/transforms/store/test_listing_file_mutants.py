"""A `_LISTED` marker is trusted only when every field checks (a mutant that let a marker of another format
through when its digests matched its waves survived `make mutate`; docs/development.md "Mutation score"): each
marker below is a valid one with one field changed."""
from __future__ import annotations

import json

import pytest

from transforms.store.listing_file import FORMAT, parse_marker

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
