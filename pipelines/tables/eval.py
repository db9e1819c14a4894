"""`pagemill eval --output DIR [--run-id ID] [--tenant T] --truth FILE`: accuracy of a run's extractions
against ground truth, beside what the run cost (from the ledger).

Truth is JSON lines, one per page: `{"source": "<file name or URI suffix>", "page_index": 0, "fields":
{"<schema field>": value, ...}}` (`page_index` optional, default 0). A truth row matches the page of the run
whose `source_uri` equals `source` or ends with `/<source>`; a duplicate document (no pages of its own) is
scored on the pages of the document it duplicates. Truth fields are compared leaf by leaf (a nested object
key by key, a list item by item): every leaf is one *compared* field; it is *correct* when the values agree
after normalisation, *missing* when the extraction has no value there (absent or null). Truth rows with no
matching page are counted and listed (`unmatched`), and their leaves count as compared and missing: a page
the run lost is a page it got wrong.

The comparison functions are pure (`same`, `compare_fields`, `score`); `command` reads the tables.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.config.storage import StorageConfig, add_storage_args, configure, storage_from
from pipelines.tables import sql
from schemas.layout import eval_path
from schemas.records import model_routes_sql
from schemas.statuses import DUPLICATE

NUMBER_TOLERANCE = 0.01  # absolute: a cent in invoice amounts
DATE_FORMATS = ("%Y-%m-%d", "%Y/%m/%d", "%d.%m.%Y", "%d/%m/%Y", "%d-%m-%Y", "%d %B %Y", "%d %b %Y", "%B %d, %Y",
                "%b %d, %Y", "%b %d %Y", "%d %b, %Y", "%Y%m%d")
_NUMBER = re.compile(r"^[^\d\-+]*([-+]?[\d.,' ]*\d)[^\d]*$")


@dataclass(frozen=True)
class TruthRow:
    source: str
    page_index: int
    fields: Mapping[str, Any]


def parse_truth(lines: Sequence[str]) -> list[TruthRow]:
    """Truth rows from JSON lines (blank lines and `#` comments skipped). Raises ValueError naming the line."""
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"truth line {n}: not JSON ({err.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("source"), str) or not obj["source"] \
                or not isinstance(obj.get("fields"), dict):
            raise ValueError(f"truth line {n}: needs a non-empty string 'source' and an object 'fields'")
        index = obj.get("page_index", 0)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ValueError(f"truth line {n}: 'page_index' must be a non-negative integer")
        rows.append(TruthRow(obj["source"], index, obj["fields"]))
    return rows


def to_number(value: Any) -> float | None:
    """A number, or a string that writes one (`1,234.50`, `$ 12`, `1.234,50`); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    m = _NUMBER.match(value.strip())
    if not m:
        return None
    text = m.group(1).replace(" ", "").replace("'", "")
    if "," in text and "." in text:  # the later one is the decimal separator
        text = text.replace(".", "").replace(",", ".") if text.rfind(",") > text.rfind(".") else text.replace(",", "")
    elif "," in text:  # one comma followed by 1-2 digits is a decimal comma; else thousands
        head, _, tail = text.rpartition(",")
        text = f"{head.replace(',', '')}.{tail}" if len(tail) in (1, 2) and text.count(",") == 1 \
            else text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def to_date(value: Any) -> dt.date | None:
    """A date written in one of DATE_FORMATS (ISO first; day before month when ambiguous), else None."""
    if not isinstance(value, str):
        return None
    text = " ".join(value.strip().split())
    if len(text) >= 10 and re.match(r"^\d{4}-\d{2}-\d{2}[T ]", text):
        text = text[:10]  # an ISO timestamp: its date
    for fmt in DATE_FORMATS:
        try:
            return dt.datetime.strptime(text, fmt).date()
        except ValueError:
            continue
    return None


def fold(text: str) -> str:
    """Case- and whitespace-folded text."""
    return " ".join(text.casefold().split())


def same(truth: Any, got: Any, tolerance: float = NUMBER_TOLERANCE) -> bool:
    """Whether an extracted leaf agrees with the truth leaf: numbers within `tolerance`, dates as dates,
    strings case- and whitespace-folded, anything else equal."""
    if truth is None:
        return got is None or (isinstance(got, str) and not got.strip())
    if got is None:
        return False
    if isinstance(truth, bool) or isinstance(got, bool):
        return truth is got
    if isinstance(truth, int | float):
        number = to_number(got)
        return number is not None and abs(number - float(truth)) <= tolerance
    if isinstance(truth, str):
        day = to_date(truth)
        if day is not None:
            return to_date(got) == day if isinstance(got, str) else False
        number = to_number(truth) if isinstance(got, int | float) else None
        if number is not None:
            return abs(float(got) - number) <= tolerance
        return isinstance(got, str) and fold(truth) == fold(got)
    return bool(truth == got)


def leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, leaf) of every leaf of a truth value: `a.b`, `items[0].amount`. An empty object or list is one
    leaf (it says "nothing here")."""
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from leaves(sub, f"{path}.{key}")
    elif isinstance(value, list) and value:
        for i, sub in enumerate(value):
            yield from leaves(sub, f"{path}[{i}]")
    else:
        yield path, value


_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def lookup(extraction: Any, path: str) -> tuple[bool, Any]:
    """(found, value) at `path` (as `leaves` writes it) inside the extraction."""
    node = extraction
    for key, index in _STEP.findall("." + path):
        if key and isinstance(node, dict) and key in node:
            node = node[key]
        elif index and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        else:
            return False, None
    return True, node


@dataclass
class Tally:
    compared: int = 0
    correct: int = 0
    missing: int = 0

    def add(self, other: Tally) -> None:
        self.compared += other.compared
        self.correct += other.correct
        self.missing += other.missing

    def as_dict(self) -> dict[str, Any]:
        return {"compared": self.compared, "correct": self.correct, "missing": self.missing,
                "accuracy": round(self.correct / self.compared, 6) if self.compared else None}


@dataclass
class PageScore:
    fields: dict[str, Tally] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)  # paths compared and not correct

    def total(self) -> Tally:
        t = Tally()
        for f in self.fields.values():
            t.add(f)
        return t


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == [] or (isinstance(value, str) and not value.strip())


def compare_fields(truth: Mapping[str, Any], extraction: Mapping[str, Any] | None,
                   tolerance: float = NUMBER_TOLERANCE) -> PageScore:
    """One page: every leaf of every truth field against the extraction (None: nothing was extracted)."""
    score = PageScore()
    for name, value in truth.items():
        tally = score.fields.setdefault(name, Tally())
        for path, leaf in leaves(value, name):
            found, got = lookup(extraction, path) if extraction is not None else (False, None)
            present = found and not _empty(got)
            tally.compared += 1
            if _empty(leaf):  # the truth says "nothing here": right when the extraction has nothing either
                ok = not present
            elif not present:
                ok = False
                tally.missing += 1
            else:
                ok = same(leaf, got, tolerance)
            if ok:
                tally.correct += 1
            else:
                score.wrong.append(path)
    return score


def match_source(source: str, uris: Sequence[str]) -> list[str]:
    """The URIs that are `source` or end with `/source` (a file name or a path suffix)."""
    return [u for u in uris if u == source or u.endswith("/" + source.lstrip("/"))]


def score(truth: Sequence[TruthRow], pages: Mapping[tuple[str, int], dict[str, Any]],
          aliases: Mapping[str, str] | None = None, tolerance: float = NUMBER_TOLERANCE,
          outcomes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Scores of the truth rows against `pages` ((source_uri, page_index) -> {"status", "extraction"}, the
    extraction as JSON text or None). `aliases`: duplicate document URI -> the URI whose pages it shares.
    `outcomes`: every document of the run -> its outcome (and reason), to say why a row has no page."""
    aliases, outcomes = aliases or {}, outcomes or {}
    uris = sorted({u for u, _ in pages} | set(aliases) | set(outcomes))
    overall, fields, by_status = Tally(), {}, {}
    documents, unmatched = [], []
    for row in truth:
        found = match_source(row.source, uris)
        problem = None if len(found) == 1 else ("no document" if not found else f"{len(found)} documents match")
        page = None
        if problem is None:
            uri = aliases.get(found[0], found[0])
            page = pages.get((uri, row.page_index))
            if page is None:
                problem = f"no page {row.page_index}" + (f" (document {outcomes[found[0]]})"
                                                          if found[0] in outcomes else "")
        extraction = None
        if page is not None and page.get("extraction"):
            try:
                extraction = json.loads(page["extraction"])
            except json.JSONDecodeError:
                extraction = None
        result = compare_fields(row.fields, extraction if isinstance(extraction, dict) else None, tolerance)
        total = result.total()
        overall.add(total)
        by_status.setdefault(page.get("status") if page else "no page", Tally()).add(total)
        for name, tally in result.fields.items():
            fields.setdefault(name, Tally()).add(tally)
        entry = {"source": row.source, "page_index": row.page_index, "source_uri": found[0] if len(found) == 1
                 else None, "status": page.get("status") if page else None, **total.as_dict(),
                 "wrong": result.wrong}
        if problem is not None:
            entry["problem"] = problem
            unmatched.append({"source": row.source, "page_index": row.page_index, "problem": problem})
        documents.append(entry)
    return {"overall": overall.as_dict(), "fields": {k: v.as_dict() for k, v in sorted(fields.items())},
            "by_status": {k: v.as_dict() for k, v in sorted(by_status.items(), key=lambda kv: str(kv[0]))},
            "documents": documents, "truth_rows": len(truth), "matched": len(truth) - len(unmatched),
            "unmatched": unmatched, "tolerance": tolerance}


def cost_figures(ledger: Mapping[str, Any], correct: int) -> dict[str, Any]:
    """Dollars and GPU-seconds a page and a correct field, from the run's ledger totals."""
    pages, usd, gpu = int(ledger.get("pages") or 0), float(ledger.get("cost_usd") or 0), \
        float(ledger.get("gpu_seconds") or 0)
    api = float(ledger.get("api_equivalent_usd") or 0)
    return {"pages": pages, "model_pages": int(ledger.get("model_pages") or 0), "cost_usd": usd, "gpu_seconds": gpu,
            "api_equivalent_usd": api,
            "usd_per_page": usd / pages if pages else None, "gpu_seconds_per_page": gpu / pages if pages else None,
            "usd_per_correct_field": usd / correct if correct else None,
            "gpu_seconds_per_correct_field": gpu / correct if correct else None,
            "api_usd_per_correct_field": api / correct if correct else None}


def evaluate(output: str, truth: Sequence[TruthRow], storage: StorageConfig | None = None, run_id: str | None = None,
             tenant: str | None = None, tolerance: float = NUMBER_TOLERANCE,
             source: sql.TableSource | None = None) -> dict[str, Any]:
    from pipelines.tables.report import find_run  # the report's rule for "which run" (latest of the tenant)

    tenant, run_id = find_run(output, storage, run_id, tenant, source)
    con = sql.connect(output, storage, tenant, source=source)
    try:
        rows = con.execute("SELECT source_uri, page_index, status, extraction FROM pages WHERE run_id = ?",
                           [run_id]).fetchall()
        outcomes = {u: o + (f" {r}" if r else "") for u, o, r in con.execute(
            "SELECT source_uri, outcome, reason_code FROM documents WHERE run_id = ?", [run_id]).fetchall()}
        aliases = dict(con.execute("SELECT source_uri, duplicate_of FROM documents WHERE run_id = ? "
                                   f"AND outcome = '{DUPLICATE}' AND duplicate_of IS NOT NULL", [run_id]).fetchall())
        totals = con.execute(f"SELECT count(*), count(*) FILTER (WHERE {model_routes_sql()}), sum(cost_usd), "
                             "sum(gpu_seconds), sum(api_equivalent_usd) FROM ledger WHERE run_id = ?",
                             [run_id]).fetchone()
    finally:
        con.close()
    pages = {(u, i): {"status": s, "extraction": e} for u, i, s, e in rows}
    result = score(truth, pages, aliases, tolerance, outcomes)
    ledger = dict(zip(("pages", "model_pages", "cost_usd", "gpu_seconds", "api_equivalent_usd"), totals, strict=True))
    return {"run_id": run_id, "tenant": tenant, **result, "cost": cost_figures(ledger, result["overall"]["correct"])}


def render_table(r: dict[str, Any]) -> str:
    o, c = r["overall"], r["cost"]

    def pct(t: dict[str, Any]) -> str:
        return "n/a" if t["accuracy"] is None else f"{100 * t['accuracy']:.1f}%"

    def money(x: float | None, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)

    lines = [f"pagemill eval: run {r['run_id']} (tenant {r['tenant']}), {r['truth_rows']} truth rows, "
             f"{r['matched']} matched",
             f"  overall   {o['correct']:,} of {o['compared']:,} fields correct ({pct(o)}), {o['missing']:,} missing",
             "  fields:"]
    width = max((len(k) for k in r["fields"]), default=5)
    lines += [f"    {k:<{width}}  {v['correct']:>5} / {v['compared']:<5} {pct(v):>6}  missing {v['missing']}"
              for k, v in r["fields"].items()]
    lines.append(f"  cost      ${c['cost_usd']:.6f} and {c['gpu_seconds']:.2f} GPU-s over {c['pages']} pages: "
                 f"${money(c['usd_per_page'], '.6f')} and {money(c['gpu_seconds_per_page'], '.3f')} GPU-s a page; "
                 f"${money(c['usd_per_correct_field'], '.6f')} and {money(c['gpu_seconds_per_correct_field'], '.3f')} "
                 "GPU-s a correct field")
    for u in r["unmatched"]:
        lines.append(f"  unmatched {u['source']} page {u['page_index']}: {u['problem']}")
    return "\n".join(lines)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, StorageConfig]:
    parser = argparse.ArgumentParser(prog="pagemill eval", allow_abbrev=False,
                                     description="Accuracy of a run's extractions against truth JSON lines, "
                                                 "with the run's cost per page and per correct field.")
    parser.add_argument("--output", required=True, help="the run's output root")
    parser.add_argument("--run-id", default=None, help="default: the latest run (of --tenant)")
    parser.add_argument("--tenant", default=None, help="needed when two tenants hold the run id")
    parser.add_argument("--truth", required=True, help='JSON lines: {"source": ..., "page_index": 0, "fields": {...}}')
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--save", action="store_true",
                        help="also write the result to DIR/evals/tenant=T/run_id=ID.json (the report shows it)")
    parser.add_argument("--number-tolerance", type=float, default=NUMBER_TOLERANCE,
                        help=f"absolute tolerance for numbers (default {NUMBER_TOLERANCE})")
    sql.add_catalog_args(parser)
    add_storage_args(parser)
    args = parser.parse_args(argv)  # unknown flags: argparse exits 2
    return args, storage_from({k: v for k, v in vars(args).items() if v})


def command(argv: Sequence[str]) -> int:
    args, storage = parse(argv)
    from schemas.layout import check_identifier  # run ids and tenants are folder names

    bad = check_identifier("--run-id", args.run_id) or check_identifier("--tenant", args.tenant)
    if bad:
        print(f"pagemill eval: {bad}", file=sys.stderr)
        return 2
    try:
        with open(args.truth, encoding="utf-8") as handle:
            truth = parse_truth(handle.read().splitlines())
    except (OSError, ValueError) as err:
        print(f"pagemill eval: {err}", file=sys.stderr)
        return 2
    configure(storage)
    try:
        result = evaluate(args.output, truth, storage, args.run_id, args.tenant, args.number_tolerance,
                          sql.TableSource.from_args(args))
    except (OSError, ValueError) as err:
        print(f"pagemill eval: {err}", file=sys.stderr)
        return 1
    if args.save:
        from apache_beam.io.filesystems import FileSystems

        # The run id and tenant came from table rows, which anyone who can write a part file controls: they
        # become a path only after the same check as the command line's (no separators, no `..`).
        bad = check_identifier("the tables' run id", result["run_id"]) or \
            check_identifier("the tables' tenant", result["tenant"])
        if bad:
            print(f"pagemill eval: not saved: {bad}", file=sys.stderr)
            return 1
        with FileSystems.create(eval_path(args.output, result["tenant"], result["run_id"])) as handle:
            handle.write(json.dumps(result, default=str, sort_keys=True).encode("utf-8"))
    print(json.dumps(result, indent=1, default=str) if args.format == "json" else render_table(result))
    return 0
