"""Tesseract OCR of one rendered page, as a child process with a time limit.

`OMP_THREAD_LIMIT=1` is set in the *child's* environment only: Tesseract's OpenMP threads fight
Beam's own parallelism, and the same variable in the worker's environment makes vLLM's CPU engine
about 20 times slower. Beam parallelises across pages instead.

The page goes to Tesseract's stdin as the JPEG it travels as (no re-encoding); its TSV output gives
the words with their boxes and confidences, from which the text (in Tesseract's reading order) and
the OCR coverage of the page are built.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

MIN_WORD_CONF = 50.0  # words below this confidence do not count as covering the page
# OcrResult.status when Tesseract ran past timeout_s. Its own word, not the reason code "timeout": the page
# goes on (with the flag ocr_timeout), nothing stopped it.
OCR_TIMED_OUT: Final = "timeout"


@dataclass(frozen=True)
class OcrSettings:
    lang: str = "eng"
    timeout_s: float = 60.0
    psm: int = 3  # fully automatic page segmentation


@dataclass(frozen=True)
class OcrWord:
    text: str
    box: tuple[int, int, int, int]  # left, top, right, bottom in page pixels
    conf: float
    line: tuple[int, int, int]  # block, paragraph, line


@dataclass(frozen=True)
class OcrResult:
    status: str  # "ok", OCR_TIMED_OUT, "failed"
    text: str = ""
    words: tuple[OcrWord, ...] = ()
    mean_conf: float = 0.0
    seconds: float = 0.0
    error: str | None = None


# What Tesseract needs from the worker's environment, and nothing else: the worker's holds Beam's
# PIPELINE_OPTIONS (storage credentials among them) and whatever the scheduler put there.
TESSERACT_ENV_KEYS = ("PATH", "TESSDATA_PREFIX", "LANG", "LC_ALL", "LC_CTYPE", "HOME", "TMPDIR")


def tesseract_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: a minimal copy of the worker's, with OpenMP limited to one thread."""
    source = os.environ if environ is None else environ
    return {**{k: source[k] for k in TESSERACT_ENV_KEYS if k in source}, "OMP_THREAD_LIMIT": "1"}


def available_languages(binary: str = "tesseract") -> tuple[str, ...]:
    """Installed Tesseract languages; () when Tesseract is missing."""
    path = shutil.which(binary)
    if path is None:
        return ()
    try:
        out = subprocess.run([path, "--list-langs"], capture_output=True, text=True, timeout=30,
                             env=tesseract_env(), check=False)
    except (OSError, subprocess.SubprocessError):
        return ()
    lines = (out.stdout + out.stderr).splitlines()
    return tuple(sorted({ln.strip() for ln in lines if ln.strip() and " " not in ln.strip() and ":" not in ln}))


def parse_tsv(tsv: str) -> tuple[OcrWord, ...]:
    words = []
    for row in tsv.splitlines()[1:]:
        cols = row.split("\t")
        if len(cols) < 12 or cols[0] != "5":
            continue
        text = cols[11].strip()
        if not text:
            continue
        left, top, width, height = (int(c) for c in cols[6:10])
        words.append(OcrWord(text=text, box=(left, top, left + width, top + height), conf=float(cols[10]),
                             line=(int(cols[2]), int(cols[3]), int(cols[4]))))
    return tuple(words)


def words_to_text(words: tuple[OcrWord, ...]) -> str:
    """Lines joined by newlines, paragraphs and blocks by a blank line, in Tesseract's order."""
    lines: list[str] = []
    current: tuple[int, int, int] | None = None
    for word in words:
        if word.line != current:
            if current is not None and word.line[:2] != current[:2]:
                lines.append("")
            lines.append(word.text)
            current = word.line
        else:
            lines[-1] += " " + word.text
    return "\n".join(lines).strip()


def run_tesseract(image: bytes, s: OcrSettings, binary: str = "tesseract") -> OcrResult:
    """OCR one page image (encoded bytes). Never raises: a timeout or a failure is a result."""
    start = time.perf_counter()
    cmd = [binary, "stdin", "stdout", "-l", s.lang, "--psm", str(s.psm), "tsv"]
    try:
        out = subprocess.run(cmd, input=image, capture_output=True, timeout=s.timeout_s, env=tesseract_env(),
                             check=False)
    except subprocess.TimeoutExpired:  # subprocess.run kills the child before raising
        return OcrResult(OCR_TIMED_OUT, seconds=time.perf_counter() - start,
                         error=f"tesseract ran past {s.timeout_s:g} s")
    except OSError as err:
        return OcrResult("failed", seconds=time.perf_counter() - start, error=f"{type(err).__name__}: {err}")
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        message = out.stderr.decode("utf-8", "replace").strip().splitlines()
        return OcrResult("failed", seconds=seconds, error=(message[-1] if message else f"exit {out.returncode}")[:300])
    words = parse_tsv(out.stdout.decode("utf-8", "replace"))
    confs = [w.conf for w in words if w.conf >= 0]
    return OcrResult("ok", text=words_to_text(words), words=words, seconds=seconds,
                     mean_conf=round(sum(confs) / len(confs), 2) if confs else 0.0)
