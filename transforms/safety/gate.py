"""Safety gate: nothing on a blocklist, and nothing the classifier rejects, reaches hints or the model.

Two places in the graph:
- `DocumentGateDoFn`, on accepted documents before dedup and rendering: a document whose sha256 is
  on a blocklist becomes a `documents` row with outcome `quarantined`, reason `blocked_hash`; it is
  never rendered, and every copy of it is quarantined the same way.
- `SafetyGateDoFn`, on rendered pages: page checks run in order (blocklists, then any extra checks
  such as a vendor hash service, then the classifier) on the page as the model would see it. The first
  verdict quarantines the page: a `pages` row with status and route `quarantined`, zero cost, which
  list and distance (or classifier and score) in `quarantine_detail`. A check that raises quarantines
  the page too (`safety_check_error`): the gate fails closed.

pagemill never writes a quarantined page's bytes anywhere: the rows hold hashes and scores only.

A page check is any object with `name` and `check(page, image) -> Verdict | None`; `--safety-check
package.module:factory` adds one (the README shows a PhotoDNA-style example).

Picture checks (a check with `pictures_only = True`: the NSFW classifier) look only at pages that can
show a picture (`holds_picture`): image inputs, and PDF pages that draw a raster image or whose ink the
text layer does not explain (scans, vector drawings, outlined text). A page of text and rules skips them,
with the note `<check>:skipped_no_raster` in `flag_detail`. Blocklists and other checks run on every page.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from PIL import Image

from schemas.reasons import BLOCKED_HASH, BLOCKED_NSFW, SAFETY_CHECK_ERROR
from schemas.records import DocumentRecord, DocumentRow, PageImage, PageRow
from schemas.statuses import QUARANTINED
from transforms.pages.render import decode_luma, decode_rgb
from transforms.pages.sizes import resize_for_detail
from transforms.pages.textlayer import PICTURE_MIN_COVERAGE
from transforms.safety.blocklist import Blocklists, Match, load_blocklists, usable_pdq
from transforms.safety.classifiers import ImageClassifier, load_classifier, load_factory

SKIPPED_NOTE = "{name}:skipped_no_raster"


@dataclass(frozen=True)
class Verdict:
    reason_code: str  # blocked_hash, blocked_nsfw (or safety_check_error, set by the gate)
    message: str
    detail: Mapping[str, Any] = field(default_factory=dict)


class PageCheck(Protocol):
    name: str

    def check(self, page: PageImage, image: Image.Image) -> Verdict | None: ...


@dataclass(frozen=True)
class SafetyConfig:
    blocklists: tuple[str, ...] = ()
    pdq_threshold: int = 31
    nsfw_classifier: str = "none"
    nsfw_threshold: float = 0.8
    checks: tuple[str, ...] = ()
    low_detail_side: int = 0  # > 0: pages may be sent this small, so that rendition is checked too

    def lists_only(self) -> SafetyConfig:
        """What checks stored hashes (documents, reused pages): no classifier, no extra checks; the same
        renditions (low detail) and threshold as the live gate."""
        return SafetyConfig(blocklists=self.blocklists, pdq_threshold=self.pdq_threshold,
                            low_detail_side=self.low_detail_side)

    def key_form(self) -> SafetyConfig:
        """The form the cache key holds (transforms/model/cache_key.py): the extra checks as a set (the first
        verdict wins, so their order never lets a page through) and no threshold without a classifier.
        Blocklists and the PDQ threshold are excluded there: reused pages are re-checked against today's
        lists by their stored hashes."""
        classifier = (self.nsfw_classifier or "none").strip()
        return replace(self, nsfw_classifier=classifier, checks=tuple(sorted(set(self.checks))),
                       nsfw_threshold=self.nsfw_threshold if classifier != "none" else 0.0)



def match_verdict(match: Match, where: str) -> Verdict:
    if match.kind == "sha256":
        message = f"sha256 of the {where} is on blocklist {match.list_uri} (line {match.line})"
    else:
        message = (f"PDQ of the {where} is within {match.distance} bits (threshold {match.threshold}) "
                   f"of blocklist {match.list_uri} line {match.line}")
    detail = {"check": "blocklist", "kind": match.kind, "list": match.list_uri, "line": match.line,
              "distance": match.distance, "where": where}
    return Verdict(BLOCKED_HASH, message, detail)


LOW_DETAIL = "page at low detail"


def has_low_rendition(size: tuple[int, int], low_side: int) -> bool:
    """Pure: whether a page of `size` px may be sent smaller than rendered (`--detail auto`), so that rendition
    is checked too: the one rule, for the live gate (the rendered size) and for reuse (the stored size)."""
    return low_side > 0 and max(size) > low_side


def pdq_hashes(image: Image.Image, low_side: int) -> tuple[str | None, str | None]:
    """The usable PDQ of the page as rendered, and of its low-detail rendition (None where it has none)."""
    low = usable_pdq(resize_for_detail(image, low_side)) if has_low_rendition(image.size, low_side) else None
    return usable_pdq(image), low


def named_renditions(size: tuple[int, int], low_side: int, pdq: str | None,
                     pdq_low: str | None) -> list[tuple[str, str | None]]:
    """Pure: (name, PDQ) of each image the model may be sent, from hashes computed now or stored in a row."""
    out = [("page", pdq)]
    if has_low_rendition(size, low_side):
        out.append((LOW_DETAIL, pdq_low))
    return out


class BlocklistCheck:
    """sha256 entries against the page hash; PDQ entries against each rendition the model may see."""

    name = "blocklist"

    def __init__(self, lists: Blocklists, threshold: int) -> None:
        self.lists, self.threshold = lists, threshold

    def check_page(self, page_hash: str | None, size: tuple[int, int], low_side: int, pdq: str | None,
                   pdq_low: str | None) -> Verdict | None:
        """The page's hash checks, the same for a page rendered now (the gate) and one reused from its
        stored hashes (transforms/output/cache.py): same renditions, same threshold."""
        return self.check_hashes(page_hash or "", named_renditions(size, low_side, pdq, pdq_low))

    def lacks_hashes(self, page_hash: str | None, size: tuple[int, int], low_side: int, pdq: str | None,
                     pdq_low: str | None) -> bool:
        """True when today's lists need a hash that a stored row does not hold (its reuse fails closed)."""
        pdqs = [h for _, h in named_renditions(size, low_side, pdq, pdq_low)]
        return bool((self.lists.sha256 and not page_hash) or (len(self.lists.pdq_sources) and None in pdqs))

    def check_hashes(self, page_hash: str, renditions: Sequence[tuple[str, str | None]]) -> Verdict | None:
        found = self.lists.match_sha256(page_hash)
        if found:
            return match_verdict(found, "page")
        for where, pdq in renditions:
            found = self.lists.match_pdq(pdq, self.threshold)
            if found:
                return match_verdict(found, where)
        return None


def holds_picture(page: PageImage) -> bool:
    """Whether the picture checks must see this page: it draws a raster image (every image input does),
    or its text layer leaves ink unexplained (truncated evidence has coverage 0, so it counts)."""
    return page.has_raster or page.text_coverage < PICTURE_MIN_COVERAGE


class ClassifierCheck:
    pictures_only = True

    def __init__(self, classifier: ImageClassifier, threshold: float) -> None:
        self.classifier, self.threshold = classifier, threshold
        self.name = classifier.name

    def check(self, page: PageImage, image: Image.Image) -> Verdict | None:
        score, label = self.classifier.score(image)
        if score < self.threshold:
            return None
        return Verdict(BLOCKED_NSFW, f"{self.name} scored {score:.3f} ({label}), threshold {self.threshold}",
                       {"check": self.name, "score": round(score, 4), "label": label, "threshold": self.threshold})


@dataclass
class Checks:
    """What a worker process loads once: the lists, extra checks and the classifier. Shared between
    the gate's threads (Beam's `Shared`), rebuilt only if the process has none."""

    lists: Blocklists
    blocklist: BlocklistCheck
    others: list[PageCheck]


def load_checks(cfg: SafetyConfig, lists: Blocklists | None = None) -> Checks:
    """`lists`: already loaded (the render process gets them from its Beam worker, which can read them)."""
    lists = load_blocklists(cfg.blocklists) if lists is None else lists
    others: list[PageCheck] = [load_factory(spec)() for spec in cfg.checks]
    classifier = load_classifier(cfg.nsfw_classifier)
    if classifier is not None:
        others.append(ClassifierCheck(classifier, cfg.nsfw_threshold))
    return Checks(lists, BlocklistCheck(lists, cfg.pdq_threshold), others)


def screen_page(page: PageImage, checks: Checks, low_side: int) -> tuple[PageImage, Verdict | None]:
    """The page with its PDQ hash, and the first verdict against it (None: it may go on). Pure apart
    from what the checks themselves do; a check that raises gives a `safety_check_error` verdict.
    PDQ hashes luminance, so the blocklist sees the JPEG's own luma channel (no colour decode); the
    colour pixels are decoded only when a check that runs on this page needs them."""
    name = "decode"
    try:
        picture = holds_picture(page)
        runs = [c for c in checks.others if picture or not getattr(c, "pictures_only", False)]
        skipped = [SKIPPED_NOTE.format(name=c.name) for c in checks.others if c not in runs]
        name = "blocklist"
        luma = decode_luma(page.image)
        pdq, pdq_low = pdq_hashes(luma, low_side)
        page = replace(page, pdq_hash=pdq, pdq_hash_low=pdq_low)  # stored: reuse re-checks both (cache.py)
        verdict = checks.blocklist.check_page(page.page_hash, luma.size, low_side, pdq, pdq_low)
        image = decode_rgb(page.image) if runs and verdict is None else None
        for check in runs:
            if verdict is not None:
                break
            name = check.name
            verdict = check.check(page, image)
        if skipped and verdict is None:
            page = replace(page, flag_detail=page.flag_detail + tuple(skipped))
    except Exception as err:  # noqa: BLE001 - fail closed: a page that could not be checked is not sent
        verdict = Verdict(SAFETY_CHECK_ERROR, f"{name}: {type(err).__name__}: {err}"[:500],
                          {"check": name, "error": type(err).__name__})
    return page, verdict


def quarantined_page(page: PageImage, verdict: Verdict) -> PageRow:
    """The row of a page stopped here: it was rendered, and it leaves the CPU stages now (`rendered_at`)."""
    return PageRow.of_page(page, QUARANTINED, hinted=False, reason_code=verdict.reason_code,
                           message=verdict.message[:500], route="quarantined",
                           rendered_at=page.rendered_at or dt.datetime.now(dt.UTC),
                           quarantine_detail=json.dumps(dict(verdict.detail), sort_keys=True))


def quarantined_reuse(earlier: Mapping[str, Any], doc_sha256: str, source_uri: str, page_index: int,
                      verdict: Verdict) -> PageRow:
    """A page whose earlier result is not reused: today's lists name its stored hashes. Nothing was
    rendered; the row keeps the hashes it was matched on."""
    detail = {**verdict.detail, "checked": "stored hashes of an earlier run"}
    return PageRow.of_index(doc_sha256, source_uri, page_index, QUARANTINED, reason_code=verdict.reason_code,
                            message=f"{verdict.message}; its earlier extraction is not reused"[:500],
                            page_hash=earlier.get("page_hash"), width=earlier.get("width"),
                            height=earlier.get("height"), route="quarantined", pdq_hash=earlier.get("pdq_hash"),
                            pdq_hash_low=earlier.get("pdq_hash_low"),
                            quarantine_detail=json.dumps(detail, sort_keys=True))


def quarantined_document(doc: DocumentRecord, verdict: Verdict) -> DocumentRow:
    return DocumentRow(source_uri=doc.uri, bytes=doc.size, outcome=QUARANTINED, doc_sha256=doc.doc_sha256,
                       format=doc.format, page_count=doc.page_count, reason_code=verdict.reason_code,
                       message=verdict.message[:500],
                       quarantine_detail=json.dumps(dict(verdict.detail), sort_keys=True))


def check_config(cfg: SafetyConfig) -> list[str]:
    """Problems to report before the run starts: unreadable lists, a classifier or check that does
    not load. Loads everything once in the launcher (cheap next to a failed run)."""
    problems = []
    try:
        load_blocklists(cfg.blocklists)
    except ValueError as err:
        problems.append(f"--blocklist: {err}")
    for spec in cfg.checks:
        try:
            load_factory(spec)
        except Exception as err:  # noqa: BLE001 - reported, not raised
            problems.append(f"--safety-check {spec}: {type(err).__name__}: {err}")
    try:
        load_classifier(cfg.nsfw_classifier)
    except Exception as err:  # noqa: BLE001
        problems.append(f"--nsfw-classifier {cfg.nsfw_classifier}: {type(err).__name__}: {err}")
    return problems
