"""olmOCR-Bench's full rule for `math` tests: an equation of the page passes when it equals the expected LaTeX, or
when the two *render alike* in KaTeX inside a headless Chromium (allenai/olmocr `olmocr/bench/katex/render.py`,
`render_equation` and `compare_rendered_equations`; `tests.py` MathTest).

Rendering, as the reference does it: KaTeX 0.16.21 (the reference's own copy, vendored in pipelines/bench/katex/),
display mode, errors thrown, 24 px in a flex-centred 800x400 page; what is kept is the MathML and every innermost
span with text and its bounding box. Two renderings are alike when the reference's MathML (its `<semantics>`
without the annotation, whitespace removed) is contained in the hypothesis's, or when every character of the
reference's spans can be matched to an equal character of the hypothesis's with the same neighbours above, below,
left and right (5 px tolerance): what the reference's backtracking search decides, in bounded time
(pipelines/bench/olmocr_layout.py; past its bound the test is unscored, never guessed). Quirks kept on purpose,
for equal verdicts: a KaTeX error renders as its message with no spans, so an expected equation that KaTeX cannot parse
matches any equation of the page.

Needs the `bench-math` extra (Playwright's Python package, whose wheel carries its driver; lxml for the MathML)
and a Chromium: `PAGEMILL_CHROMIUM`, else `chromium` or `chromium-browser` on PATH. Playwright's own browser
download is never used. Without them `unavailable()` says what is missing and the bench keeps the exact rule.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from pipelines.bench.olmocr_layout import Span, no_spaces, same_layout
from pipelines.bench.olmocr_tests import MathRule

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")
FONT_PX = 24
VIEWPORT = {"width": 800, "height": 400}
_PAGE = """<!DOCTYPE html><html><head><style>
body { display: flex; justify-content: center; align-items: center; height: 100vh; margin: 0;
       background-color: white; color: black; }
#equation-container { padding: 0; font-size: FONT_PXpx; }
</style></head><body><div id="equation-container"></div></body></html>""".replace("FONT_PX", str(FONT_PX))
# Renders one equation into the container and returns its MathML and innermost text spans, or the KaTeX error.
_RENDER_JS = """(latex) => {
  const box = document.getElementById("equation-container");
  box.innerHTML = "";
  try { katex.render(latex, box, {displayMode: true, throwOnError: true}); }
  catch (error) { return {error: error.message}; }
  const spans = [];
  for (const span of document.querySelectorAll("span")) {
    if (span.children.length === 0 && /\\S/.test(span.textContent)) {
      const r = span.getBoundingClientRect();
      spans.push([span.textContent.trim(), r.x, r.y, r.width, r.height]);
    }
  }
  const math = document.querySelector(".katex-mathml math");
  return {mathml: math ? math.outerHTML : "", spans: spans};
}"""


@dataclass(frozen=True)
class Rendered:
    mathml: str  # the KaTeX error message when `error` is set (as the reference keeps it)
    spans: tuple[Span, ...]
    error: str | None = None


def chromium_path() -> str | None:
    return os.environ.get("PAGEMILL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def unavailable() -> str | None:
    """Why the rendered rule cannot run here (None when it can)."""
    import importlib.util

    for module, extra in (("playwright", "playwright"), ("lxml", "lxml")):
        if importlib.util.find_spec(module) is None:
            return f"{extra} is not installed (pip install -e '.[bench-math]')"
    if chromium_path() is None:
        return "no Chromium (set PAGEMILL_CHROMIUM or install chromium)"
    return None


class KatexRenderer:
    """One headless Chromium with KaTeX loaded, started on the first equation; renders are cached by LaTeX."""

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self._cache: dict[str, Rendered] = {}
        self._playwright: Any = None
        self._browser: Any = None
        self._page: Any = None

    def _start(self) -> Any:
        from playwright.sync_api import sync_playwright

        katex = resources.files("pipelines.bench") / "katex"
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(executable_path=self.executable, args=list(CHROMIUM_FLAGS))
        page = self._browser.new_context(viewport=VIEWPORT).new_page()
        page.set_content(_PAGE)
        page.add_style_tag(content=(katex / "katex.min.css").read_text(encoding="utf-8"))
        page.add_script_tag(content=(katex / "katex.min.js").read_text(encoding="utf-8"))
        if not page.evaluate("typeof katex !== 'undefined'"):
            raise RuntimeError("KaTeX did not load in Chromium")
        return page

    def render(self, latex: str) -> Rendered:
        if latex not in self._cache:
            self._page = self._page or self._start()
            out = self._page.evaluate(_RENDER_JS, latex)
            if out.get("error") is not None:
                self._cache[latex] = Rendered(out["error"], (), out["error"])
            else:
                self._cache[latex] = Rendered(out["mathml"], tuple(Span(*s) for s in out["spans"]))
        return self._cache[latex]

    def close(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._playwright is not None:
            self._playwright.stop()
        self._browser = self._playwright = self._page = None


def mathml_core(mathml: str) -> str:
    """The MathML's `<semantics>` children but the annotation (the whole document when it has none), serialised
    by BeautifulSoup's XML parser as the reference does, whitespace removed."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(mathml, "xml")
    semantics = soup.find("semantics")
    if semantics is None:
        return no_spaces(str(soup))
    return no_spaces("".join(str(c) for c in semantics.contents if getattr(c, "name", None) != "annotation"))


def alike(reference: Rendered, hypothesis: Rendered) -> bool | None:
    """The reference's compare_rendered_equations (None: unscored, the layout match gave up)."""
    if mathml_core(reference.mathml) in mathml_core(hypothesis.mathml):
        return True
    ref = [s for s in reference.spans if no_spaces(s.text)]
    hyp = [s for s in hypothesis.spans if no_spaces(s.text)]
    return same_layout(ref, hyp)


def rendered_rule(render: Callable[[str], Rendered]) -> MathRule:
    """The rule `(expected LaTeX, the page's equations) -> passed` (None: unscored) that renders what exact
    matching missed, most similar equations first (rapidfuzz's ratio, as the reference orders them)."""
    from rapidfuzz import fuzz

    def passes(expected: str, equations: Sequence[str]) -> bool | None:
        if expected in equations:
            return True
        if not equations:
            return False
        want, unscored = render(expected), False
        for e in sorted(equations, key=lambda e: -fuzz.ratio(e, expected)):
            verdict = alike(want, render(e))
            if verdict:
                return True
            unscored = unscored or verdict is None
        return None if unscored else False  # None: no equation matched, and one could not be decided

    return passes


_OPEN: list[KatexRenderer] = []  # the renderer of the outermost math_rule() still open: Playwright's sync API
# allows one instance a thread, so a nested math_rule() shares it.


@contextmanager
def math_rule() -> Iterator[tuple[MathRule | None, str]]:
    """(the rendered rule, a line saying so), or (None, why not) where it cannot run; Chromium starts only when
    an equation needs rendering, and stops on leaving the outermost math_rule()."""
    reason = unavailable()
    if reason is not None:
        yield None, f"exact LaTeX match only ({reason}; the reference also accepts equations that render alike)"
        return
    note = "exact LaTeX match or alike in KaTeX 0.16.21 (Chromium), as the reference"
    if _OPEN:
        yield rendered_rule(_OPEN[0].render), note
        return
    _OPEN.append(KatexRenderer(chromium_path() or ""))
    try:
        yield rendered_rule(_OPEN[0].render), note
    finally:
        _OPEN.pop().close()
