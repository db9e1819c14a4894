"""`pagemill estimate`: page sizes equal what the page stage renders, counts equal what a run writes, image
(and text) tokens equal the engine's own counts for the tiny model, and the demo and corpus folders price."""
from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from pipelines import cli
from pipelines.estimate.scan import ScanSettings, scan_data, scan_object
from pipelines.tables import sql
from schemas.records import DocumentRecord, ListedObject, PageImage
from tests.conftest import CORPUS as SHARED_CORPUS
from tests.conftest import vllm_available
from tests.support import cost_runs, docmaker
from transforms.intake.inspection import IntakeLimits
from transforms.intake.reading import ReadConfig
from transforms.model import budget
from transforms.pages import sizes
from transforms.pages.render import RenderSettings, render_document

REPO = Path(__file__).resolve().parents[3]
CORPUS = SHARED_CORPUS / "extraction_gt"
LIMITS = IntakeLimits(max_bytes=50 * 2**20, max_pages=5000, max_image_pixels=89_478_485)
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (scripts/setup_venv.sh)")


def processor_image_tokens(width: int, height: int) -> int:
    """The reference: image tokens from transformers' own Qwen2-VL image processor (the grid it makes for an
    image of that size, 2x2 patches merged into one token), with the released checkpoints' pixel bounds."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2,
                                    temporal_patch_size=2)
    out = proc(images=[Image.new("RGB", (width, height), "white")], return_tensors="np")
    t, grid_h, grid_w = (int(x) for x in out["image_grid_thw"][0])
    return t * grid_h * grid_w // 4


def estimate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    capsys.readouterr()
    assert cli.main(["estimate", "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def rendered_sizes(data: bytes, dpi: float, max_side: int, limit: int | None = None) -> list[tuple[int, int] | str]:
    """What transforms.pages.render really produces: (width, height) of each page, or its reason code."""
    settings = RenderSettings(dpi=dpi, max_side=max_side, jpeg_quality=90, max_text_chars=20_000,
                              max_page_points=14_400, max_image_pixels=LIMITS.max_image_pixels,
                              max_bytes=LIMITS.max_bytes)
    result = scan_data(ListedObject("mem://doc", len(data)), data, ScanSettings(LIMITS, dpi, max_side, 14_400, 20_000,
                                                                               True, ReadConfig()))
    assert result.status == "accepted", result
    doc = DocumentRecord("mem://doc", len(data), result.doc_sha256 or "", result.format or "", len(result.pages))
    out: list[tuple[int, int] | str] = []
    for page in render_document(doc, data, settings):
        if isinstance(page, PageImage):
            assert Image.open(io.BytesIO(page.image)).size == (page.width, page.height)
            out.append((page.width, page.height))
        else:
            out.append(page.reason_code or "?")
        if limit and len(out) >= limit:
            break
    return out


def estimated_sizes(data: bytes, dpi: float, max_side: int, limit: int | None = None) -> list[tuple[int, int] | str]:
    result = scan_data(ListedObject("mem://doc", len(data)), data, ScanSettings(LIMITS, dpi, max_side, 14_400, 20_000,
                                                                               False, ReadConfig()))
    pages = result.pages[:limit] if limit else result.pages
    return [p.reason_code if p.reason_code else (p.width, p.height) for p in pages]


def rotated_pdf() -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for i, page in enumerate(PdfReader(io.BytesIO(docmaker.multipage_pdf(3))).pages):
        writer.add_page(page.rotate(90 * i))
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


def odd_tiff() -> bytes:
    frames = [Image.new("RGB", size, "white") for size in ((1700, 2200), (300, 40), (2000, 15))]
    buf = io.BytesIO()
    frames[0].save(buf, "TIFF", save_all=True, append_images=frames[1:])
    return buf.getvalue()


def exif_png() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 8
    buf = io.BytesIO()
    Image.new("RGB", (900, 1400), "white").save(buf, "PNG", exif=exif.tobytes())
    return buf.getvalue()


DOCUMENTS: dict[str, Callable[[], bytes]] = {
    "invoice": docmaker.invoice_pdf, "letter": lambda: docmaker.text_pdf([["Letter"]], page_size=(612, 792)),
    "odd-points": lambda: docmaker.text_pdf([["Odd"]], page_size=(1001, 333)),
    "wide-page": cost_runs.wide_middle_page_pdf, "rotated": rotated_pdf,
    "scan": docmaker.scanned_png, "exif-jpeg": docmaker.exif_rotated_jpeg, "exif-png": exif_png,
    "tiff-frames": odd_tiff, "gif": docmaker.animated_gif, "tiny": docmaker.tiny_png, "cmyk": docmaker.jpeg_cmyk,
    "webp": docmaker.webp, "bmp": docmaker.bmp,
}


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
@pytest.mark.parametrize(("dpi", "max_side"), [(150, 1288), (72, 800), (200, 2000), (300, 333)])
def test_page_sizes_equal_the_rendered_pages(name: str, dpi: float, max_side: int) -> None:
    data = DOCUMENTS[name]()
    assert estimated_sizes(data, dpi, max_side) == rendered_sizes(data, dpi, max_side)


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus/ is absent")
def test_page_sizes_equal_the_rendered_pages_on_the_corpus() -> None:
    checked = 0
    for path in sorted(CORPUS.rglob("*")):
        if path.suffix.lower() not in (".pdf", ".png") or path.stat().st_size > LIMITS.max_bytes:
            continue
        data = path.read_bytes()
        settings = ScanSettings(LIMITS, 150, 1288, 14_400, 1, False, ReadConfig())
        if scan_object(ListedObject(str(path), len(data)), settings).status != "accepted":
            continue
        assert estimated_sizes(data, 150, 1288, limit=3) == rendered_sizes(data, 150, 1288, limit=3), path
        checked += 1
    assert checked >= 50


def test_counts_follow_intake_dedup_and_page_limits(tmp_path_factory: pytest.TempPathFactory,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    inputs = cost_runs.inputs_folder(tmp_path_factory)
    r = estimate_json(capsys, "--input", str(inputs), "--max-side", "800", "--per-page", "--workers", "3")
    d, p = r["documents"], r["pages"]
    assert d["listed"] == len(list(inputs.iterdir()))
    assert d["reject_reasons"] == {"unreadable": 1, "unsupported_format": 2}
    assert (d["duplicate"], d["cached"], d["to_extract"]) == (1, 0, 5)
    # invoice 1 + report-a 3 + report-b 2 + scan 1 + wide 3, plus the copy's page.
    assert (p["in_accepted_documents"], p["duplicate"]) == (11, 1)
    assert p["failed_before_model"] == {"page_too_large": 1}
    assert p["to_model"] == 9 == sum(1 for x in r["per_page"] if x["status"] == "model")
    model = [x for x in r["per_page"] if x["status"] == "model"]
    # Derived by hand, not with transforms.model.budget. At --max-side 800 an A4 page (595x842 pt) renders 566x800
    # and the scan 470x620. --detail auto sends the 8 text-layer pages at --low-detail-side 640 (453x640)
    # and the scan as rendered. Qwen2-VL rounds each side to a multiple of 28 px, one token per 28x28:
    #   453x640 -> 448x644 -> 16x23 = 368 tokens;  566x800 -> 560x812 -> 20x29 = 580;  470x620 -> 476x616 ->
    #   17x22 = 374.  Sent: 8 x 368 + 374 = 3318; at high detail: 8 x 580 + 374 = 5014.
    assert sorted((x["sent_width"], x["sent_height"]) for x in model) == [(453, 640)] * 8 + [(470, 620)]
    assert (r["tokens"]["image"], r["tokens"]["image_at_high_detail"]) == (3318, 5014)
    assert [x["image_tokens"] for x in model].count(368) == 8
    text = r["tokens"]["text"]
    assert text == sum(x["text_tokens"] for x in model)
    assert r["tokens"]["output"] == 9 * 1024  # no --output: --max-tokens, the default
    # Hosted prices by hand from each vendor's published rules and list prices (schemas/prices.json, read
    # 2026-11-29), for the 9 pages as sent (8 at 453x640, the scan at 470x620):
    # - gpt-4o: shortest side under 768, so 1x2 tiles of 512: 170 x 2 + 85 = 425 a page, 9 x 425 = 3825 tokens;
    #   $2.50 in / $10.00 out per 1M tokens.
    # - claude: w*h/750, rounded up: 289,920/750 -> 387, 291,400/750 -> 389: 8 x 387 + 389 = 3485; $3 / $15.
    # - gemini: over 384 px, one 768x768 tile of 258: 9 x 258 = 2322; $0.30 / $2.50.
    hand = {"gpt-4o": (3825, 2.50, 10.00), "claude-sonnet": (3485, 3.00, 15.00),
            "gemini-2.5-flash": (2322, 0.30, 2.50)}
    assert {h["provider"] for h in r["hosted"]} == set(hand)
    for h in r["hosted"]:
        image, usd_in, usd_out = hand[h["provider"]]
        assert (h["image_tokens"], h["input_tokens"], h["output_tokens"]) == (image, image + text, 9216)
        assert h["usd"] == pytest.approx(((image + text) * usd_in + 9216 * usd_out) / 1e6)
    # The default throughput and price: 9 pages / 0.67 pages/s = 13.43 s = 0.003731 h at $2.50 = $0.009328.
    s = r["self_hosted"]
    assert (s["pages_per_s"], s["gpu_hourly_usd"]) == (0.67, 2.5)
    assert s["usd"] == pytest.approx(0.009328, abs=1e-6)
    assert "NOT a measurement" in s["throughput_source"]


def test_over_budget_pages_shrink_or_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.pdf").write_bytes(docmaker.invoice_pdf())
    # Room for the prompt but only ~300 image tokens: the page is shrunk, as engines/vllm_shared/templated.py does.
    text = estimate_json(capsys, "--input", str(tmp_path), "--per-page", "--max-model-len", "100000")["per_page"][0]
    r = estimate_json(capsys, "--input", str(tmp_path), "--per-page", "--max-tokens", "100",
                      "--max-model-len", str(text["text_tokens"] + 100 + 300))
    (page,) = r["per_page"]
    assert page["status"] == "model" and page["image_tokens"] <= 300 < text["image_tokens"]
    assert (page["sent_width"], page["sent_height"]) == budget.fit_to_token_budget(page["width"], page["height"], 300)
    assert processor_image_tokens(page["sent_width"], page["sent_height"]) == page["image_tokens"] <= 300
    r = estimate_json(capsys, "--input", str(tmp_path), "--per-page", "--max-model-len", "1000")
    assert r["pages"]["failed_before_model"] == {"over_token_budget": 1}


def test_detail_follows_the_hints_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "invoice.pdf").write_bytes(docmaker.invoice_pdf())
    (tmp_path / "scan.png").write_bytes(docmaker.scanned_png())
    full = {Path(p["source_uri"]).name: p for p in
            estimate_json(capsys, "--input", str(tmp_path), "--per-page", "--detail", "high")["per_page"]}
    for name in full:
        assert (full[name]["sent_width"], full[name]["sent_height"]) == (full[name]["width"], full[name]["height"])
    for mode, low_names in (("low", {"invoice.pdf", "scan.png"}), ("auto", {"invoice.pdf"})):
        r = estimate_json(capsys, "--input", str(tmp_path), "--per-page", "--detail", mode, "--low-detail-side", "500")
        for p in r["per_page"]:
            name = Path(p["source_uri"]).name
            image = Image.new("RGB", (p["width"], p["height"]))  # the page as rendered, then as extract sends it
            sent = sizes.resize_for_detail(image, 500).size if name in low_names else image.size
            assert (p["sent_width"], p["sent_height"]) == sent, (mode, name)
            assert p["image_tokens"] == processor_image_tokens(*sent)
            assert p["high_detail_image_tokens"] == full[name]["image_tokens"]
        assert r["tokens"]["image"] < r["tokens"]["image_at_high_detail"]


# Published list prices (schemas/prices.json, read on 2026-11-29), USD per million input and output tokens.
LIST_PRICES = {"gpt-4o": (2.5, 10.0), "claude-sonnet": (3.0, 15.0), "gemini-2.5-flash": (0.3, 2.5)}


def test_samples_folder_prints_tokens_and_dollars(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--input", str(REPO / "samples"), "--pages-per-second", "2"]
    r = estimate_json(capsys, *args)
    # samples/: README.md (unsupported) and corrupt.pdf rejected; the receipt's copy a duplicate; the invoice
    # (1 page), the receipt (1) and the report (3): 5 pages, each at most --max-tokens 1024 out.
    assert r["documents"] | {"reject_reasons": None} == {"listed": 6, "rejected": 2, "reject_reasons": None,
                                                         "duplicate": 1, "cached": 0, "to_extract": 3}
    assert r["pages"]["to_model"] == 5 and r["tokens"]["output"] == 5 * 1024
    # Image tokens from transformers' Qwen2-VL processor on the pages as really rendered (--dpi 150,
    # --max-side 1288); under --detail auto the PDF pages (text layer) go at the low-detail side, 640.
    rendered = {name: rendered_sizes((REPO / "samples" / name).read_bytes(), 150, 1288)
                for name in ("invoice-2026-001.pdf", "receipt-scan.png", "report-3pages.pdf")}
    high = sum(processor_image_tokens(*size) for sizes_ in rendered.values() for size in sizes_)  # type: ignore[misc]
    sent = [sizes.resize_for_detail(Image.new("RGB", size), 640).size if name.endswith(".pdf") else size
            for name, sizes_ in rendered.items() for size in sizes_]  # type: ignore[misc]
    assert (r["tokens"]["image_at_high_detail"], r["tokens"]["image"]) == \
        (high, sum(processor_image_tokens(*size) for size in sent))
    # Self-hosted: 5 pages at 2 pages/s on a $2.5/h GPU.
    assert r["self_hosted"]["usd"] == pytest.approx(5 / 2 / 3600 * 2.5)
    check_prices(r)
    text = r["tokens"]["text"]
    capsys.readouterr()
    assert cli.main(["estimate", *args]) == 0
    out = capsys.readouterr().out
    for line in ("documents  listed 6; rejected 2 (unreadable 1, unsupported_format 1); duplicate 1; cached 0; "
                 "to extract 3",
                 f"tokens     image {r['tokens']['image']:,} ({high:,} if every page went at full detail), "
                 f"text {text:,}, output 5,120",
                 "self-hosted $0.0017 ($0.3472 per 1,000 pages): 0.0007 GPU-hours at $2.5/h",
                 *(f"{h['provider']:<17} $ {h['usd']:>11.4f}" for h in r["hosted"])):
        assert line in out, (line, out)


def test_route_of_a_served_or_hosted_run(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--input", str(REPO / "samples"), "--pages-per-second", "2", "--sample-pages", "0"]
    local = estimate_json(capsys, *args)
    assert local["route"] == {"route": "model", "usd": local["self_hosted"]["usd"],
                              "basis": "GPU-hours at $2.5/h"}
    served = estimate_json(capsys, *args, "--engine", "openai", "--model", "served-name")
    assert (served["route"]["route"], served["route"]["usd"]) == ("served", served["self_hosted"]["usd"])
    free = estimate_json(capsys, *args, "--engine", "openai", "--gpu-hourly-usd", "0")
    assert free["route"]["usd"] == 0 and "not counted" in free["route"]["basis"]
    hosted = estimate_json(capsys, *args, "--engine", "openai", "--endpoint-kind", "hosted", "--api-price",
                           "claude-sonnet")
    claude = next(h for h in hosted["hosted"] if h["provider"] == "claude-sonnet")
    assert (hosted["route"]["route"], hosted["route"]["usd"]) == ("api:claude-sonnet", claude["usd"])
    assert claude["usd"] > 0


def test_errors_are_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["estimate"]) == 2
    assert cli.main(["estimate", "--input", str(tmp_path), "--pages-per-second", "0"]) == 1
    assert cli.main(["estimate", "--input", str(tmp_path), "--schema", str(tmp_path / "missing.json")]) == 1
    r = estimate_json(capsys, "--input", str(tmp_path / "missing.pdf"))
    assert r["documents"]["reject_reasons"] == {"not_found": 1}


def corpus_expectations(folder: str) -> tuple[int, dict[str, int], int]:
    """From the corpus's manifest.csv (each file probed with pypdf and Pillow in a sandbox, independently of
    pagemill): files listed, reject reasons, and pages of the accepted documents (a duplicate of a file
    outside `folder` counts as a document of its own)."""
    import csv

    listed, pages, reasons = 0, 0, {"unsupported_format": 0, "encrypted": 0, "unreadable": 0}
    with open(SHARED_CORPUS / "manifest.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if not row["local_path"].startswith(folder + "/"):
                continue
            listed += 1
            probe = json.loads(row["probe"] or "{}")
            if probe.get("kind") not in ("pdf", "image"):
                reasons["unsupported_format"] += 1
            elif probe.get("encrypted"):
                reasons["encrypted"] += 1
            elif "error" in probe:
                reasons["unreadable"] += 1
            else:
                pages += probe["pages"] if probe["kind"] == "pdf" else probe["frames"]
    return listed, reasons, pages


def check_prices(r: dict) -> None:
    """The estimate's money, from its own token counts by hand: output --max-tokens (1024) a page; self-hosted
    GPU-hours at its pages/s and $2.5/h; each hosted API its list price on its own image tokens plus the same
    text and output tokens."""
    to_model, text = r["pages"]["to_model"], r["tokens"]["text"]
    assert r["tokens"]["output"] == to_model * 1024
    hosted_self = r["self_hosted"]
    assert hosted_self["gpu_hours"] == pytest.approx(to_model / hosted_self["pages_per_s"] / 3600)
    assert hosted_self["usd"] == pytest.approx(hosted_self["gpu_hours"] * 2.5)
    assert [h["provider"] for h in r["hosted"]] == list(LIST_PRICES)
    for hosted in r["hosted"]:
        price_in, price_out = LIST_PRICES[hosted["provider"]]
        assert hosted["input_tokens"] == hosted["image_tokens"] + text and hosted["output_tokens"] == to_model * 1024
        assert hosted["usd"] == pytest.approx((hosted["input_tokens"] * price_in + to_model * 1024 * price_out) / 1e6)
        assert hosted["usd_per_1k_pages"] == pytest.approx(hosted["usd"] / to_model * 1000)


@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpus/ is absent")
def test_corpus_prices(capsys: pytest.CaptureFixture[str]) -> None:
    r = estimate_json(capsys, "--input", str(CORPUS))
    listed, reasons, pages = corpus_expectations("extraction_gt")
    assert listed == len([p for p in CORPUS.rglob("*") if p.is_file()])
    assert r["documents"]["listed"] == listed and r["documents"]["reject_reasons"] == reasons
    assert r["documents"]["duplicate"] == 0 and r["pages"]["to_model"] == pages
    check_prices(r)
    # Image tokens: at most every page at full detail, and the hints send the text-layer pages smaller.
    assert 0 < r["tokens"]["image"] < r["tokens"]["image_at_high_detail"]
    with capsys.disabled():
        print(f"\ncorpus estimate: {r['documents']}, pages {r['pages']}, tokens {r['tokens']}, "
              f"self-hosted ${r['self_hosted']['usd']:.4f}, " +
              ", ".join(f"{h['provider']} ${h['usd']:.4f}" for h in r["hosted"]) + f", timing {r['timing']}")


@pytest.mark.vllm
@needs_vllm
def test_tokens_equal_the_engine_counts(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    output = cost_runs.extract_runs(tmp_path_factory, test_model_dir)
    _, rows = sql.query(str(output), "SELECT l.source_uri, l.page_index, l.image_tokens, l.text_tokens "
                                     "FROM ledger l WHERE run_id = 't1' AND route = 'model'")
    engine = {(u, i): (img, txt) for u, i, img, txt in rows}
    assert len(engine) >= 7
    r = estimate_json(capsys, "--input", str(cost_runs.inputs_folder(tmp_path_factory)), "--per-page",
                      "--model", str(test_model_dir), *cost_runs.RUN_FLAGS)
    assert any(a.startswith("text tokens: exact") for a in r["assumptions"]), r["assumptions"]
    est = {(p["source_uri"], p["page_index"]): (p["image_tokens"], p["text_tokens"])
           for p in r["per_page"] if p["status"] == "model"}
    # Every page the engine saw, with the same image and text token counts. The estimate also holds the pages
    # the run answered without the engine: the second copy of the shared terms page, and the quarantined page.
    assert {k: est[k] for k in engine} == engine
    _, others = sql.query(str(output), "SELECT source_uri, page_index FROM pages WHERE run_id = 't1' "
                                       "AND status IN ('duplicate', 'quarantined')")
    assert set(est) - set(engine) == set(others) and len(others) == 2


@pytest.mark.vllm
@needs_vllm
def test_cache_and_measured_output_tokens(tmp_path_factory: pytest.TempPathFactory, test_model_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    output = cost_runs.extract_runs(tmp_path_factory, test_model_dir)
    inputs = cost_runs.inputs_folder(tmp_path_factory)
    r = estimate_json(capsys, "--input", str(inputs), "--output", str(output), "--model", str(test_model_dir),
                      "--model-revision", "tiny", *cost_runs.RUN_FLAGS)
    _, docs = sql.query(str(output), "SELECT count(*) FILTER (WHERE outcome = 'extracted'), "
                                     "sum(page_count) FILTER (WHERE outcome IN ('partial', 'failed')) "
                                     "FROM documents WHERE run_id = 't1'")
    _, mean = sql.query(str(output), "SELECT avg(l.output_tokens) FROM ledger l JOIN pages p USING "
                                     "(run_id, doc_sha256, page_index) WHERE l.route = 'model' AND p.status = 'ok'")
    # Every extracted document is cached; wide.pdf (a failed page) is not, so its other pages remain.
    extracted, left = docs[0]
    assert r["documents"]["cached"] == extracted >= 3
    assert r["pages"]["failed_before_model"] == {"page_too_large": 1}
    assert r["pages"]["to_model"] == left - 1 >= 2
    assert r["tokens"]["output"] == round(r["pages"]["to_model"] * mean[0][0])
    # Another model revision shares nothing.
    r = estimate_json(capsys, "--input", str(inputs), "--output", str(output), "--model", str(test_model_dir),
                      "--model-revision", "other", *cost_runs.RUN_FLAGS)
    assert r["documents"]["cached"] == 0


def test_bench_estimate_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_estimate.py"), "--objects", "100",
                           "--sample-pages", "20", "--json"], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-2000:]
    f = json.loads(done.stdout.strip().splitlines()[-1])
    # The bench's corpus, by hand: objects i = 0..99 by slot i % 50: 0-4 a copy of an earlier object (but i = 0,
    # an invoice), 5 a truncated PDF, 6 random bytes, 7-29 an invoice (1 page), 30-39 a report (3), 40-49 a scan
    # (1). Two blocks of 50: 9 copies, 2 + 2 rejected, 47 invoices, 20 reports, 20 scans.
    assert f["kinds"] == {"copy": 9, "truncated": 2, "random": 2, "invoice": 47, "report": 20, "scan": 20}
    assert f["documents"] == {"listed": 100, "rejected": 4, "reject_reasons": {"unreadable": 2,
                              "unsupported_format": 2}, "duplicate": 9, "cached": 0, "to_extract": 87}
    assert f["pages_to_model"] == 47 + 3 * 20 + 20
    # The extrapolation: the per-object phases scaled to 100,000 objects, plus the one-time rest of the wall.
    per_object = f["list_s"] + f["scan_s"] + f["plan_s"]
    assert f["extrapolated_100k_s"] == pytest.approx(per_object / 100 * 100_000 + f["wall_s"] - per_object, abs=1.0)


def test_sample_is_seeded_and_whole_when_small() -> None:
    from pipelines.estimate.detail import sample_documents, stratum

    docs = [scanned_doc(f"d{i}", i % 3 + 1) for i in range(40)]
    assert sample_documents(docs, 1000, 0) == docs  # no more pages than the budget: every document, in order
    first, again, other = (sample_documents(docs, 10, s) for s in (7, 7, 8))
    assert first == again and first != other
    assert 10 <= sum(len(d.pages) for d in first) < 10 + 3  # stops once the budget is reached
    assert (stratum("pdf", " x "), stratum("pdf", "  "), stratum("png", "x")) == \
        ("pdf_text_layer", "pdf_no_text_layer", "image")


def scanned_doc(uri: str, pages: int) -> object:
    from pipelines.estimate.scan import Scanned
    from transforms.pages.sizes import PageSize

    return Scanned(uri, 1, "accepted", None, uri, "pdf", tuple(PageSize(i, 10, 10, "t") for i in range(pages)))


def test_interval_is_zero_without_extrapolation_and_shrinks_with_more_pages() -> None:
    from pipelines.estimate.detail import interval

    assert interval({}, {"pdf_text_layer": (0.5, 10)}, {"pdf_text_layer": 10}) == 0
    pages = {"pdf_text_layer": [(100, 1000)] * 50}
    few = interval(pages, {"pdf_text_layer": (0.5, 10)}, {"pdf_text_layer": 60})
    many = interval(pages, {"pdf_text_layer": (0.5, 40)}, {"pdf_text_layer": 90})
    assert 0 < many < few
    # Nothing measured in the stratum: half of what going low could save, either way.
    assert interval(pages, {}, {"pdf_text_layer": 50}) == pytest.approx(1.96 * 900 * 50 / 2)


@pytest.mark.vllm
@needs_vllm
@pytest.mark.skipif(not SHARED_CORPUS.is_dir(), reason="../shared/corpus/ is absent")
def test_default_settings_estimate_within_5_percent_of_the_ledger(tmp_path_factory: pytest.TempPathFactory,
                                                                   test_model_dir: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support import invoice2data_run

    output = invoice2data_run.corpus_run(tmp_path_factory, test_model_dir)
    _, rows = sql.query(str(output), "SELECT sum(image_tokens), sum(text_tokens), count(*) FROM ledger "
                                     "WHERE run_id = 'i2d' AND route = 'model'")
    (ledger_image, ledger_text, pages), = rows
    assert pages == 13  # the 11 PDFs: QualityHosting and free_fiber have 2 pages
    r = estimate_json(capsys, "--input", invoice2data_run.INPUT, "--model", str(test_model_dir),
                      *invoice2data_run.FLAGS)
    old = estimate_json(capsys, "--input", invoice2data_run.INPUT, "--model", str(test_model_dir),
                        "--sample-pages", "0", *invoice2data_run.FLAGS)
    with capsys.disabled():
        print(f"\ninvoice2data, default settings: ledger image tokens {ledger_image:,}, text {ledger_text:,}; "
              f"estimate {r['tokens']['image']:,} / {r['tokens']['text']:,} ({r['detail']['method']}); "
              f"without rendering {old['tokens']['image']:,} / {old['tokens']['text']:,}")
    assert r["detail"]["rendered_pages"] == pages
    assert abs(r["tokens"]["image"] - ledger_image) <= 0.05 * ledger_image
    assert abs(r["tokens"]["text"] - ledger_text) <= 0.05 * ledger_text
    # A sample of part of the pages: the ledger lies inside the stated interval.
    part = estimate_json(capsys, "--input", invoice2data_run.INPUT, "--model", str(test_model_dir),
                         "--sample-pages", "8", "--sample-seed", "3", *invoice2data_run.FLAGS)
    low, high = part["detail"]["image_tokens_interval_95"]
    assert part["detail"]["extrapolated_pages"] > 0 and low <= ledger_image <= high, part["detail"]
