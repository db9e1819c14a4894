"""`pagemill estimate` on the command line: its options, the table it prints, its exit codes. The
estimate itself is `pipelines.estimate.estimate.estimate`."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from pipelines.config.options import PagemillOptions, merge_flags, parse_bool
from pipelines.config.storage import StorageConfig, add_storage_args, configure, storage_from
from pipelines.estimate.estimate import estimate


def render_table(r: dict[str, Any]) -> str:
    d, p, t, s = r["documents"], r["pages"], r["tokens"], r["self_hosted"]
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(d["reject_reasons"].items()))
    failed = ", ".join(f"{k} {v}" for k, v in sorted(p["failed_before_model"].items()))
    tm = r["timing"]
    lines = [
        f"pagemill estimate: {', '.join(r['inputs'])} (schema {r['schema']}, model {r['model']})",
        f"  scanned    {d['listed']:,} objects in {tm['total_s']:.1f} s (set-up {tm['setup_s']:.1f} s, listing "
        f"{tm['list_s']:.1f} s, read and measured {tm['bytes_read']:,} bytes in {tm['scan_s']:.1f} s with "
        f"{tm['workers']} threads, rendered in {tm['render_s']:.1f} s, tokens {tm['plan_s']:.1f} s)",
        f"  documents  listed {d['listed']:,}; rejected {d['rejected']:,}" + (f" ({reasons})" if reasons else "")
        + f"; duplicate {d['duplicate']:,}; cached {d['cached']:,}; to extract {d['to_extract']:,}",
        f"  pages      {p['to_model']:,} to the model; in accepted documents {p['in_accepted_documents']:,}, "
        f"of which duplicate {p['duplicate']:,}, cached {p['cached']:,}"
        + (f", failing before the model {failed}" if failed else ""),
        f"  tokens     image {t['image']:,} ({t['image_at_high_detail']:,} if every page went at full detail), "
        f"text {t['text']:,}, output {t['output']:,}",
        f"  detail     {r['detail']['method']}"
        + ("; image tokens 95% interval {:,}-{:,}".format(*r["detail"]["image_tokens_interval_95"])
           if r["detail"].get("extrapolated_pages") else ""),
        f"  self-hosted ${s['usd']:,.4f} (${s['usd_per_1k_pages']:,.4f} per 1,000 pages): {s['gpu_hours']:,.4f} "
        f"GPU-hours at ${s['gpu_hourly_usd']:g}/h",
        f"  this run   route {r['route']['route']}: ${r['route']['usd']:,.4f} ({r['route']['basis']})",
        f"  hosted APIs at list prices read on {r['prices_read_on']}:",
    ]
    width = max(len(h["provider"]) for h in r["hosted"]) if r["hosted"] else 8
    for h in r["hosted"]:
        lines.append(f"    {h['provider']:<{width}}  ${h['usd']:>12,.4f}  (${h['usd_per_1k_pages']:,.4f} per 1,000 "
                     f"pages; image tokens {h['image_tokens']:,} by the {h['image_family']} formula)")
    lines.append("  assumptions:")
    lines += [f"    - {a}" for a in r["assumptions"]]
    return "\n".join(lines)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, PagemillOptions, StorageConfig]:
    parser = argparse.ArgumentParser(
        prog="pagemill estimate", allow_abbrev=False,
        description="A dry run: tokens and dollars of a run before it runs. Takes `pagemill run`'s options "
                    "(--input, --job, --output for the result cache, --schema, --model, --model-family, --dpi, "
                    "--max-side, --max-tokens, --max-model-len, --gpu-hourly-usd, limits) plus these:")
    parser.add_argument("--job", default=None, help="a job file, as for `pagemill run`")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--pages-per-second", type=float, default=None,
                        help="self-hosted throughput (default: schemas/throughput.json, measured by bench_extract)")
    parser.add_argument("--output-tokens", type=float, default=None,
                        help="output tokens a page (default: the mean of earlier runs under --output, "
                             "else --max-tokens)")
    parser.add_argument("--read-text", type=parse_bool, default=True, help="read PDF text layers for the hint tokens")
    parser.add_argument("--per-page", action="store_true", help="json: add one entry per page")
    parser.add_argument("--workers", type=int, default=8, help="threads reading and measuring objects")
    parser.add_argument("--sample-pages", type=int, default=200,
                        help="render at most this many pages to decide hints and detail as the run does (all pages "
                             "when there are no more; else a seeded random sample, the rest extrapolated); 0: none")
    parser.add_argument("--sample-seed", type=int, default=0, help="seed of the --sample-pages sample")
    add_storage_args(parser)
    args, rest = parser.parse_known_args(argv)
    from pipelines.config.presets import with_preset

    flags = with_preset(merge_flags(rest, args.job))
    # As `pagemill run`: storage flags on the command line win over those in the job file or Beam's own, and
    # the options carry them (Beam's S3Options), so that objects are read with the run's own settings.
    given = {k: v for k, v in vars(args).items() if v}
    storage = storage_from({**PagemillOptions(flags).get_all_options(), **given})
    return args, PagemillOptions(flags + storage.beam_flags()).view_as(PagemillOptions), storage


def command(argv: Sequence[str]) -> int:
    try:
        args, o, storage = parse(argv)
    except (OSError, ValueError) as err:
        print(f"pagemill estimate: {err}", file=sys.stderr)
        return 2
    if not o.input:
        print("pagemill estimate: --input is required (or a --job file that sets it)", file=sys.stderr)
        return 2
    configure(storage)
    from pipelines.run.run_log import command_log

    try:
        with command_log("estimate"):  # a tokenizer's or a library's chatter: in a log, not between the figures
            report = estimate(o, storage, pages_per_second=args.pages_per_second, output_tokens=args.output_tokens,
                              read_text=args.read_text, workers=args.workers, per_page=args.per_page,
                              sample_pages=args.sample_pages, sample_seed=args.sample_seed)
    except (OSError, ValueError) as err:
        print(f"pagemill estimate: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=1, default=str) if args.format == "json" else render_table(report))
    return 0
