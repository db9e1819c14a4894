"""The kept-row rule (schemas/kept_row.py) where a sampled mutant survived (issue 43, docs/development.md
"Mutation score"): among rows of one invocation the later write (`attempt_seq`) wins, from 0 on; a key without
rows is an error that says so. Rows made here; the expected row follows from the rule in the module's docstring."""
from __future__ import annotations

import datetime as dt

import pytest

from schemas.kept_row import keep

START = dt.datetime(2026, 12, 7, 10, tzinfo=dt.UTC)


def row(seq: int | None, note: str, status: str = "ok") -> dict:
    return {"tenant": "t", "run_id": "r", "doc_sha256": "d", "page_index": 0, "status": status,
            "created_at": START, "attempt_seq": seq, "message": note}


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_the_later_write_of_one_invocation_wins_from_sequence_0(order: tuple[int, int]) -> None:
    """Writes 0 and 1 of one invocation (same created_at), in either order on disk: write 1 is kept."""
    rows = [row(seq, f"write {seq}") for seq in order]
    assert keep("pages", rows)["message"] == "write 1"


def test_a_write_with_a_sequence_beats_one_without() -> None:
    assert keep("pages", [row(0, "numbered"), row(None, "unnumbered")])["message"] == "numbered"
    assert keep("pages", [row(None, "unnumbered"), row(0, "numbered")])["message"] == "numbered"


def test_a_key_without_rows_is_an_error_that_says_so() -> None:
    with pytest.raises(ValueError, match=r"^a key has at least one row$"):
        keep("pages", [])
