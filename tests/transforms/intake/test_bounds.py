"""A listed URI is read only when it lies under one of this invocation's `--input` roots
(transforms/intake/bounds.py `within_inputs`, pure), whatever the listing says: folders, wildcards, `@FILE`
lists and S3 prefixes, with the prefix and `..` tricks a planted listing would try (issue 32, finding 1)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from schemas.records import ListedObject
from tests.support.intake_limits import LIMITS
from transforms.intake.accept import IntakeDoFn
from transforms.intake.bounds import contained, input_roots, normalised_inputs, within_inputs
from transforms.intake.listing import list_matching
from transforms.intake.reading import ObjectReader, ReadConfig, ReadFailed

ROOTS = ["alpha_in", "s3://docs/alpha_in/", "s3://docs/scans/*.png", "/data/one.pdf"]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Relative --input as a user types them: a folder `alpha_in/` beside `alpha_in2/` and `bravo_in/`."""
    for folder in ("alpha_in/sub", "alpha_in2", "bravo_in"):
        (tmp_path / folder).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("uri", "inside"), [
    ("alpha_in/a.pdf", True),
    ("alpha_in/sub/b.pdf", True),  # a folder is recursive
    ("alpha_in/./a.pdf", True),  # stays in the folder
    ("alpha_in2/a.pdf", False),  # a longer name is another folder
    ("alpha_in/../bravo_in/x.pdf", False),  # `..` climbs out, though the glob's `**` matches it
    ("alpha_in/sub/../../bravo_in/x.pdf", False),
    ("bravo_in/x.pdf", False),
    ("/etc/passwd", False),
    ("s3://docs/alpha_in/k.pdf", True),
    ("s3://docs/alpha_in/deep/k.pdf", True),
    ("s3://docs/alpha_in2/k.pdf", False),
    ("s3://docs/alpha_in/../bravo_in/k.pdf", False),
    ("s3://other/alpha_in/k.pdf", False),  # another bucket, same key
    ("s3://docs/scans/p.png", True),
    ("s3://docs/scans/deep/p.png", False),  # `*` stops at a /
    ("s3://docs/scans/p.pdf", False),
    ("/data/one.pdf", True),  # a file named on its own
    ("/data/../data/one.pdf", False),  # is only itself, as written
    ("/data/two.pdf", False),
    ("file:///data/one.pdf", True),
])
def test_within_inputs(in_tmp: Path, uri: str, inside: bool) -> None:
    assert within_inputs(uri, input_roots(ROOTS)) is inside


def test_an_at_file_covers_the_uris_it_names(in_tmp: Path) -> None:
    (in_tmp / "list.txt").write_text("# uploads\nbravo_in/x.pdf\ns3://docs/day/*.pdf\n")
    roots = input_roots(["@list.txt"])
    assert within_inputs("bravo_in/x.pdf", roots) and within_inputs("s3://docs/day/a.pdf", roots)
    assert not within_inputs("bravo_in/y.pdf", roots) and not within_inputs("list.txt", roots)
    assert not within_inputs("s3://docs/day2/a.pdf", roots)


def test_what_the_listing_lists_is_within_its_inputs(in_tmp: Path) -> None:
    """The real listing of folders, a wildcard and an @FILE, each URI checked against the same roots."""
    for name in ("alpha_in/a.pdf", "alpha_in/sub/b.pdf", "alpha_in2/c.pdf", "bravo_in/x.pdf", "bravo_in/y.png"):
        (in_tmp / name).write_bytes(b"x")
    (in_tmp / "list.txt").write_text("bravo_in/x.pdf\n")
    inputs = ["alpha_in", "bravo_in/*.png", "@list.txt"]
    listed = [o.uri for o in list_matching(inputs)]
    assert sorted(Path(u).name for u in listed) == ["a.pdf", "b.pdf", "x.pdf", "y.png"]
    assert all(within_inputs(u, input_roots(inputs)) for u in listed)
    assert not within_inputs("alpha_in2/c.pdf", input_roots(inputs))


def test_contained_is_by_whole_segments() -> None:
    assert contained("a/b", "a") and contained("a", "a") and not contained("ab/c", "a")
    assert contained("x", ".") and not contained("../x", ".") and not contained("/x", ".")
    assert contained("/a/b", "/") and not contained("/ab", "/a/")


def test_normalised_inputs(in_tmp: Path) -> None:
    """What a listing records: local paths absolute, a folder with its /, @FILE's file too; sorted, once."""
    base = str(in_tmp)
    given = ["alpha_in", "alpha_in/", "./alpha_in", "s3://docs/in/", "@list.txt", "*.pdf"]
    expected = [f"@{base}/list.txt", f"{base}/*.pdf", f"{base}/alpha_in/", "s3://docs/in/"]
    assert normalised_inputs(given) == tuple(sorted(expected))
    assert normalised_inputs(["alpha_in"]) != normalised_inputs(["alpha_in2"])


def test_the_reader_refuses_a_uri_outside_before_opening_it(in_tmp: Path) -> None:
    (in_tmp / "bravo_in" / "x.pdf").write_bytes(b"%PDF-bravo")
    (in_tmp / "alpha_in" / "a.pdf").write_bytes(b"%PDF-alpha")
    reader = ObjectReader(ReadConfig(inputs=input_roots(["alpha_in/"])))
    with pytest.raises(ReadFailed) as refused:
        reader.read("alpha_in/../bravo_in/x.pdf", 100)
    assert refused.value.reason_code == "outside_input" and "bravo" not in str(refused.value)
    assert reader.read("alpha_in/a.pdf", 100) == b"%PDF-alpha"
    assert ObjectReader(ReadConfig()).read("bravo_in/x.pdf", 100) == b"%PDF-bravo"  # no roots: not checked


def test_intake_rejects_outside_first_whatever_size_was_listed(in_tmp: Path) -> None:
    secret = in_tmp / "bravo_in" / "x.pdf"
    secret.write_bytes(b"%PDF-1.4 bravo")
    dofn = IntakeDoFn(LIMITS, ObjectReader(ReadConfig(inputs=input_roots([os.path.join(in_tmp, "alpha_in")]))))
    for size in (secret.stat().st_size, LIMITS.max_bytes + 1, 0):  # a listing may claim any size
        (row,) = list(dofn.process(ListedObject(uri=str(secret), size=size)))
        row = row.value  # tagged `rejected`
        assert (row.outcome, row.reason_code, row.doc_sha256) == ("rejected", "outside_input", None)
