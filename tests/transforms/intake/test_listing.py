"""Listing (transforms/intake/listing.py): expand_input, the symlink rule, the time window and missing names
as pure functions; the ListObjects transform on a small Beam pipeline, against `list_matching` (what
`pagemill estimate` lists)."""
from __future__ import annotations

from pathlib import Path

import pytest

from schemas.reasons import REASON_CODES
from schemas.records import ListedObject
from tests.support import docmaker
from tests.support.intake_limits import LIMITS
from transforms.intake.accept import size_gate
from transforms.intake.listing import MISSING, ListObjects, expand_input, in_window, missing_object, to_listed
from transforms.intake.reading import read_capped

# --- expand_input --------------------------------------------------------------------------------

def test_expand_folder_becomes_recursive_glob(tmp_path: Path) -> None:
    assert expand_input(str(tmp_path)) == [f"{tmp_path}/**"]
    assert expand_input(f"{tmp_path}/") == [f"{tmp_path}/**"]
    assert expand_input("s3://bucket/prefix/") == ["s3://bucket/prefix/**"]


def test_expand_file_and_glob_are_kept(tmp_path: Path) -> None:
    f = tmp_path / "a.pdf"
    f.write_bytes(b"%PDF-1.4")
    assert expand_input(str(f)) == [str(f)]
    assert expand_input(f"{tmp_path}/*.pdf") == [f"{tmp_path}/*.pdf"]
    assert expand_input("s3://bucket/a.pdf") == ["s3://bucket/a.pdf"]
    assert expand_input(str(tmp_path / "missing.pdf")) == [str(tmp_path / "missing.pdf")]


def test_expand_at_file_list(tmp_path: Path) -> None:
    listing = tmp_path / "inputs.txt"
    listing.write_text("# documents for the January run\n"
                       "\n"
                       "/data/a.pdf\n"
                       "   s3://bucket/b.png   \n"
                       "  # an indented comment\n"
                       "/data/folder/*.tiff\n")
    assert expand_input(f"@{listing}") == ["/data/a.pdf", "s3://bucket/b.png", "/data/folder/*.tiff"]


def test_expand_empty_at_file(tmp_path: Path) -> None:
    listing = tmp_path / "empty.txt"
    listing.write_text("# nothing yet\n\n")
    assert expand_input(f"@{listing}") == []


# Inputs stay inside what was listed (issue 16, item 7).

def _tree(tmp_path: Path) -> Path:
    """in/a.pdf; in/inner.pdf -> a.pdf (inside); in/link.pdf -> ../out/secret.pdf (outside)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "in" / "a.pdf").write_bytes(docmaker.invoice_pdf())
    (tmp_path / "out" / "secret.pdf").write_bytes(docmaker.multipage_pdf(1, title="Secret"))
    (tmp_path / "in" / "inner.pdf").symlink_to("a.pdf")
    (tmp_path / "in" / "link.pdf").symlink_to(tmp_path / "out" / "secret.pdf")
    return tmp_path / "in"


@pytest.mark.parametrize("glob", ["{d}/**", "{d}/*.pdf", "{d}/l*"])
def test_symlink_out_of_a_listed_folder_is_not_followed(tmp_path: Path, glob: str) -> None:
    from transforms.intake.listing import OUTSIDE, match_pattern

    folder = _tree(tmp_path)
    listed = {Path(o.uri).name: o for o in match_pattern(glob.format(d=folder))}
    assert listed["link.pdf"].size == OUTSIDE
    row = size_gate(listed["link.pdf"], LIMITS)
    assert row is not None and (row.outcome, row.reason_code, row.bytes) == ("rejected", "outside_input", 0)
    assert row.reason_code in REASON_CODES and "outside" in (row.message or "")
    if "a.pdf" in listed:  # a symlink inside the folder to a file inside it is followed
        assert listed["inner.pdf"].size == listed["a.pdf"].size > 0
        assert size_gate(listed["inner.pdf"], LIMITS) is None


def test_a_file_named_on_its_own_is_followed(tmp_path: Path) -> None:
    from transforms.intake.listing import match_pattern

    folder = _tree(tmp_path)
    (listed,) = match_pattern(str(folder / "link.pdf"))  # named explicitly: the caller chose it
    assert listed.size == len((tmp_path / "out" / "secret.pdf").read_bytes())


# --- the time window, missing names, ListObjects ---------------------------------------------

@pytest.mark.parametrize(("modified", "since", "until", "taken"), [
    (None, 100.0, 200.0, True),  # an unknown time is always taken
    (100.0, 100.0, 200.0, True),  # since is inclusive
    (99.9, 100.0, 200.0, False),
    (199.9, 100.0, 200.0, True),
    (200.0, 100.0, 200.0, False),  # until is exclusive: back-to-back windows take each object once
    (5.0, None, 200.0, True), (500.0, 100.0, None, True), (5.0, 100.0, None, False), (500.0, None, 200.0, False),
    (5.0, None, None, True)])
def test_in_window(modified: float | None, since: float | None, until: float | None, taken: bool) -> None:
    assert in_window(ListedObject("s3://b/k.pdf", 10, modified), since, until) is taken


def test_to_listed_and_read_capped(tmp_path: Path) -> None:
    from apache_beam.io.filesystem import FileMetadata

    meta = FileMetadata(str(tmp_path / "a.pdf"), 1234, last_updated_in_seconds=17.5)
    assert to_listed(meta) == ListedObject(str(tmp_path / "a.pdf"), 1234, 17.5)
    path = tmp_path / "ten.bin"
    path.write_bytes(b"0123456789")
    assert read_capped(str(path), 4) == b"01234"  # limit + 1: enough to tell "over the limit"
    assert read_capped(str(path), 100) == b"0123456789"


def test_missing_literal_uris_are_listed_as_missing(tmp_path: Path) -> None:
    (tmp_path / "here.pdf").write_bytes(b"x")
    assert list(missing_object(str(tmp_path / "here.pdf"))) == []
    assert list(missing_object(str(tmp_path / "gone.pdf"))) == [ListedObject(str(tmp_path / "gone.pdf"), MISSING)]
    gone = "nosuchscheme://bucket/key.pdf"
    assert list(missing_object(gone)) == [ListedObject(gone, MISSING)]


def test_list_objects_lists_each_object_once_and_reports_missing_names(tmp_path: Path) -> None:
    import os

    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
    from apache_beam.testing.util import assert_that, equal_to

    (tmp_path / "sub").mkdir()
    for name, mtime in (("a.pdf", 100), ("sub/b.png", 150), ("sub/c.pdf", 300)):
        (tmp_path / name).write_bytes(b"1234")
        os.utime(tmp_path / name, (mtime, mtime))
    patterns = [str(tmp_path), str(tmp_path / "a.pdf"), str(tmp_path / "sub" / "*.png"), str(tmp_path / "gone.pdf")]
    with BeamPipeline() as p:
        got = p | ListObjects(patterns) | beam.Map(lambda o: (Path(o.uri).name, o.size))
        assert_that(got, equal_to([("a.pdf", 4), ("b.png", 4), ("c.pdf", 4), ("gone.pdf", MISSING)]))
    with BeamPipeline() as p:
        got = p | ListObjects([str(tmp_path)], modified_since=100, modified_until=300) | beam.Map(
            lambda o: Path(o.uri).name)
        assert_that(got, equal_to(["a.pdf", "b.png"]))


@pytest.mark.parametrize(("since", "until"), [(None, None), (100, 300), (150, None)])
def test_the_estimate_lists_what_the_pipeline_lists(tmp_path: Path, since: float | None,
                                                    until: float | None) -> None:
    """`list_matching` (pagemill estimate) and the `ListObjects` transform give the same objects: a file
    named twice, a missing name, symlinks in and out of the folder, an @FILE listing and the time window."""
    import os

    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from transforms.intake.listing import OUTSIDE, list_matching

    folder = _tree(tmp_path)
    (folder / "sub").mkdir()
    (folder / "sub" / "b.png").write_bytes(docmaker.scanned_png())
    for path, mtime in ((folder / "a.pdf", 100), (folder / "sub" / "b.png", 150),
                        (tmp_path / "out" / "secret.pdf", 300)):  # the links list their targets' times
        os.utime(path, (mtime, mtime))
    listing = tmp_path / "listing.txt"
    listing.write_text(f"# named\n{folder / 'a.pdf'}\n{tmp_path / 'gone.pdf'}\n")
    patterns = [str(folder), str(folder / "sub" / "*.png"), f"@{listing}", str(tmp_path / "out" / "gone.pdf")]
    listed = list_matching(patterns, since, until)
    assert [o.uri for o in listed] == sorted(o.uri for o in listed)  # each URI once, in order
    with BeamPipeline() as p:
        got = p | ListObjects(patterns, modified_since=since, modified_until=until) | beam.Map(
            lambda o: (o.uri, o.size, o.last_modified))
        assert_that(got, equal_to([(o.uri, o.size, o.last_modified) for o in listed]))
    sizes = {Path(o.uri).name: o.size for o in listed}
    assert sizes["gone.pdf"] == MISSING and ("link.pdf" not in sizes or sizes["link.pdf"] == OUTSIDE)
    assert ("a.pdf" in sizes) == ("inner.pdf" in sizes) == (since is None or since <= 100)
    assert ("link.pdf" in sizes) == (until is None)
