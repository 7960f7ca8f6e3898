"""`linnet site build`: the records and the zoo through the templates into static HTML.

    index = build_site(Path("site/_build"))     # returns the index page's path

Reads zoo/entries.toml (through the registry), the parity records (results/parity, or
$LINNET_RESULTS), the benchmark results (bench/results) and docs/language.md; writes
index.html, matrix.html, models/NAME.html, bench/SUITE.html, language.html and style.css.
A broken record stops the build with a SiteError naming its file.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from linnet.site import pages
from linnet.site.bench import BENCH_MODELS, read_bench
from linnet.site.highlight import highlight
from linnet.site.matrix import RUNTIMES, matrix
from linnet.site.records import SiteError, read_parity

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = Path("site") / "_build"


@dataclass
class Inputs:
    """Where the build reads from (relative paths: from the current folder)."""

    results: Path = Path("results") / "parity"
    bench: Path = Path("bench") / "results"
    language: Path = Path("docs") / "language.md"

    @classmethod
    def default(cls, results=None, bench=None, language=None) -> Inputs:
        env = os.environ.get("LINNET_RESULTS")
        return cls(
            Path(results or env or cls.results),
            Path(bench or cls.bench),
            Path(language or cls.language),
        )


def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["runtimes"] = RUNTIMES
    env.globals["model_file"] = pages.model_file
    return env


def entry_finder(registry):
    """name -> the canonical entry name, for zoo names, aliases and the benchmarks' names."""

    def find(name: str) -> str | None:
        if name in registry:
            return registry.get(name).name
        if name in BENCH_MODELS:
            return BENCH_MODELS[name]
        prefixed = [k for k in (*registry.entries, *BENCH_MODELS) if name.startswith(k + "-")]
        if prefixed:  # "smollm2-135m-instruct-f32", "tinyllama-shaped-1.1b-bf16"
            best = max(prefixed, key=len)
            return BENCH_MODELS.get(best, best)
        return None

    return find


def language_html(path: Path) -> tuple[str, list[tuple[str, str, int]]]:
    """docs/language.md as HTML with an id on every heading, and its table of contents."""
    from markdown_it import MarkdownIt

    if not path.is_file():
        raise SiteError(f"{path}: the language reference is missing (run from the repository root)")
    md = MarkdownIt("commonmark", {"xhtmlOut": True, "highlight": _fence}).enable("table")
    tokens = md.parse(path.read_text(encoding="utf-8"))
    toc, seen = [], set()
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            text = "".join(c.content for c in tokens[i + 1].children or [])  # no markup
            slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
            while slug in seen:
                slug += "-"
            seen.add(slug)
            tok.attrSet("id", slug)
            toc.append((slug, text, int(tok.tag[1])))
    return md.renderer.render(tokens, md.options, {}), toc


def _fence(code: str, lang: str, _attrs) -> str:
    """Fenced blocks: `text` fences in the reference are .linnet code."""
    language = "linnet" if lang in ("", "text", "linnet") else lang
    return str(highlight(code, language))


class Site:
    """The loaded records and the pages made from them."""

    def __init__(self, inputs: Inputs):
        from linnet.zoo.registry import registry

        self.registry = registry()
        self.entries = list(self.registry)
        find = entry_finder(self.registry)
        self.parity = read_parity(inputs.results, find)
        self.suites = read_bench(inputs.bench, find)
        rows = [r for s in self.suites for r in s.rows]
        self.matrix = matrix(self.entries, self.parity, rows)
        self.inputs = inputs

    def pages(self):
        """(file, template, context) for every page."""
        cells = self.matrix["cells"]
        yield (
            "index.html",
            "index.html.j2",
            {
                "cards": [pages.card(e, cells[e.name], self.parity) for e in self.entries],
                "records": len(self.parity),
                "bench_rows": sum(len(s.rows) for s in self.suites),
            },
        )
        yield (
            "matrix.html",
            "matrix.html.j2",
            {
                "entries": self.entries,
                "cells": cells,
                "measured": self.matrix["measured"],
                "orphans": [r for r in self.parity if r.entry is None],
            },
        )
        for e in self.entries:
            page = pages.model_page(e, cells[e.name], self.parity, self.suites)
            yield pages.model_file(e.name), "model.html.j2", page
        for s in self.suites:
            page = {"suite": s, "comparisons": pages.comparisons(s), "table": pages.bench_table(s)}
            yield f"bench/{s.key}.html", "bench.html.j2", page
        yield "bench/index.html", "bench_index.html.j2", {}
        body, toc = language_html(self.inputs.language)
        yield "language.html", "language.html.j2", {"body": body, "toc": toc}


def build_site(out: str | os.PathLike | None = None, inputs: Inputs | None = None) -> Path:
    """Write the site under `out` (default site/_build); returns the index page's path."""
    out = Path(out or DEFAULT_OUT)
    site = Site(inputs or Inputs.default())
    env = environment()
    rendered = []
    for name, template, context in site.pages():  # render everything before writing
        root = "../" * name.count("/")
        html = env.get_template(template).render(root=root, suites=site.suites, **context)
        rendered.append((out / name, html))
    clear(out)
    for path, html in rendered:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
    shutil.copyfile(HERE / "templates" / "style.css", out / "style.css")
    for suite in site.suites:  # the plots the bench pages show (bench/SUITE.html)
        for name, source in suite.images.items():
            shutil.copyfile(source, out / "bench" / name)
    (out / MARKER).write_text("written by linnet site build; the next build replaces it\n")
    return out / "index.html"


MARKER = ".linnet-site"


def clear(out: Path) -> None:
    """Empty the output folder of an earlier build; never a folder that holds anything else."""
    if not out.exists():
        return
    if not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file()):
        raise SiteError(f"{out}: exists and is not an earlier site build; pick another --out")
    shutil.rmtree(out)
