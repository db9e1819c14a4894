"""PageRow's constructors: a page's carried fields are copied in one place, and none is forgotten."""
from __future__ import annotations

import datetime as dt
from dataclasses import MISSING, fields

from schemas.records import PageImage, PageRow

# PageImage fields that are not `pages` columns: the page in flight needs them, the table does not.
NOT_STORED = {"image", "text_layer", "text_coverage", "invisible_text", "has_raster", "detail_side",
              "words"}  # the words become `evidence` rows, not a `pages` column
# Set by the hints stage (after the safety gate): a page stopped at the gate has none of them yet.
HINTED = {"hint_source", "hint", "hint_coverage", "detail", "flags", "flag_detail", "rendered_at"}
SAMPLES = {"str": "value", "int": 7, "float": 0.25, "bytes": b"x", "bool": False,
           "tuple[str, ...]": ("one", "two"), "str | None": "value",
           "dt.datetime | None": dt.datetime(2026, 1, 2, tzinfo=dt.UTC)}


def busy_page() -> PageImage:
    """A page whose every field differs from its default (so a field left uncopied shows)."""
    values = {}
    for f in fields(PageImage):
        assert f.type in SAMPLES, f"PageImage.{f.name}: add a sample value for {f.type!r}"
        value = SAMPLES[f.type]
        if isinstance(value, str):
            value = f"{f.name}-{value}"
        elif f.type == "bool" and f.default is not MISSING:
            value = not f.default
        values[f.name] = value
    return PageImage(**values)


def test_every_page_image_field_is_stored_or_named_as_not_stored() -> None:
    row_fields = {f.name for f in fields(PageRow)}
    for f in fields(PageImage):
        assert (f.name in row_fields) != (f.name in NOT_STORED), (
            f"PageImage.{f.name}: a `pages` column (copy it in PageRow.of_page) or in NOT_STORED, not both/neither")


def test_of_page_copies_every_stored_field() -> None:
    page = busy_page()
    row = PageRow.of_page(page, "rendered", route="none")
    for f in fields(PageImage):
        if f.name not in NOT_STORED:
            assert getattr(row, f.name) == getattr(page, f.name), f.name
    assert (row.status, row.route) == ("rendered", "none")


def test_result_fields_win_over_the_carried_ones() -> None:
    page = busy_page()
    row = PageRow.of_page(page, "ok", flags=("merged",), rendered_at=None, extraction="{}")
    assert (row.flags, row.rendered_at, row.extraction) == (("merged",), None, "{}")
    assert row.flag_detail == page.flag_detail


def test_a_page_stopped_at_the_gate_keeps_its_identity_and_hashes_only() -> None:
    page = busy_page()
    row = PageRow.of_page(page, "quarantined", hinted=False, route="quarantined")
    bare = PageRow(doc_sha256="d", source_uri="u", page_index=0, status="quarantined")
    for name in HINTED:
        assert getattr(row, name) == getattr(bare, name), name  # the PageRow default, not the page's value
    for name in ("doc_sha256", "source_uri", "page_index", "page_hash", "width", "height", "pdq_hash"):
        assert getattr(row, name) == getattr(page, name), name


def test_a_blank_hint_is_stored_as_null() -> None:
    page = PageImage(doc_sha256="d", source_uri="u", page_index=0, page_hash="h", image=b"", width=1, height=1)
    assert PageRow.of_page(page, "rendered").hint is None


def test_of_index_is_the_place_and_the_given_fields() -> None:
    row = PageRow.of_index("d", "u", 3, "failed", reason_code="render_failed", route="failed")
    expected = PageRow(doc_sha256="d", source_uri="u", page_index=3, status="failed", reason_code="render_failed",
                       route="failed")
    assert row == expected
