"""`pagemill estimate` at scale: times the dry run over N small generated objects and extrapolates to 100,000.

Writes N files into a temp folder (default 10,000): one-page invoices and three-page reports (PDF, with a
text layer), scanned-looking PNGs, 10 % byte-identical copies (dedup), 2 % truncated PDFs and 2 % random
bytes (rejected). Every file is distinct unless it is meant as a copy (a counter is appended after the
end of the PDF or PNG). Then runs `pipelines.estimate.estimate.estimate` in this process (no pipeline, no model;
the tiny test model's tokenizer unless --model is given) and prints the time of each phase, objects/s
and the 100,000-object figure extrapolated linearly (listing, reading and measuring are per object).

    .venv/bin/python benchmarks/bench_estimate.py [--objects 10000] [--workers 8] [--sample-pages 200] [--json]

Prints figures; asserts nothing about time.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from pipelines.config.options import PagemillOptions  # noqa: E402
from pipelines.config.storage import StorageConfig  # noqa: E402
from pipelines.estimate.estimate import estimate  # noqa: E402
from tests.support import docmaker  # noqa: E402


def make_corpus(root: Path, n: int) -> dict[str, int]:
    """n files under root (in 100 sub-folders); returns how many of each kind."""
    bases = {"invoice": [docmaker.invoice_pdf(seed=s) for s in range(20)],
             "report": [docmaker.multipage_pdf(3, title=f"Report {s}") for s in range(5)],
             "scan": [docmaker.scanned_png(seed=s) for s in range(5)]}
    kinds: dict[str, int] = {}
    written: list[Path] = []
    for i in range(n):
        folder = root / f"d{i % 100:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        slot = i % 50
        if slot < 5 and written:  # 10 %: a copy of an earlier object
            kind, data, ext = "copy", written[(i * 7919) % len(written)].read_bytes(), "bin"
        elif slot == 5:
            kind, data, ext = "truncated", docmaker.truncated_pdf(), "pdf"
        elif slot == 6:
            kind, data, ext = "random", docmaker.random_bytes(2048, seed=i), "pdf"
        elif slot < 30:
            kind, data, ext = "invoice", bases["invoice"][i % 20] + b"%% variant %d\n" % i, "pdf"
        elif slot < 40:
            kind, data, ext = "report", bases["report"][i % 5] + b"%% variant %d\n" % i, "pdf"
        else:
            kind, data, ext = "scan", bases["scan"][i % 5] + i.to_bytes(8, "big"), "png"
        path = folder / f"obj-{i:06d}.{ext}"
        path.write_bytes(data)
        if kind != "copy":
            written.append(path)
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--model", default=None, help="model folder for the tokenizer (default: the tiny test model)")
    p.add_argument("--read-text", default="true", choices=("true", "false"))
    p.add_argument("--sample-pages", type=int, default=200,
                   help="pages rendered to decide hints and detail (as `pagemill estimate`); 0: none")
    p.add_argument("--json", action="store_true", help="end with one JSON line of every figure")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-estimate-") as tmp:
        root = Path(tmp)
        model = args.model
        if model is None:
            from pipelines.tiny_models import make_test_model

            model = str(make_test_model(root / "tiny-qwen2-vl"))
        t0 = time.perf_counter()
        kinds = make_corpus(root / "in", args.objects)
        made = time.perf_counter() - t0
        o = PagemillOptions(["--input", str(root / "in"), "--model", model, "--schema", "invoice"])
        t1 = time.perf_counter()
        r = estimate(o.view_as(PagemillOptions), StorageConfig(), workers=args.workers,
                     read_text=args.read_text == "true", sample_pages=args.sample_pages)
        wall = time.perf_counter() - t1
    t = r["timing"]
    # Set-up (schema, tokenizer) is once, and rendering is bounded by --sample-pages: neither grows with objects.
    per_object = (t["list_s"] + t["scan_s"] + t["plan_s"]) / args.objects
    figures = {"bench": "estimate", "objects": args.objects, "kinds": kinds, "make_s": round(made, 2),
               "workers": args.workers, "read_text": args.read_text == "true", "sample_pages": args.sample_pages,
               **t, "wall_s": round(wall, 2),
               "objects_per_s": round(args.objects / wall, 1), "pages_to_model": r["pages"]["to_model"],
               "documents": r["documents"], "extrapolated_100k_s": round(per_object * 100_000 + (wall - t["list_s"]
                                                                     - t["scan_s"] - t["plan_s"]), 1)}
    print(f"estimate over {args.objects:,} objects ({kinds}; made in {made:.1f} s):")
    print(f"  set-up {t['setup_s']:.1f} s, list {t['list_s']:.1f} s, read+hash+sniff+measure {t['scan_s']:.1f} s "
          f"({args.workers} threads, {t['bytes_read']:,} bytes), rendering {t['render_s']:.1f} s "
          f"(--sample-pages {args.sample_pages}), tokens+prices {t['plan_s']:.1f} s; "
          f"wall {wall:.1f} s = {args.objects / wall:,.0f} objects/s")
    print(f"  documents {r['documents']}; pages to the model {r['pages']['to_model']:,}; image tokens "
          f"{r['tokens']['image']:,} (95% interval {r['detail']['image_tokens_interval_95']}); {r['detail']['method']}")
    print(f"  100,000 objects: about {figures['extrapolated_100k_s'] / 60:.1f} min (linear in objects)")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
