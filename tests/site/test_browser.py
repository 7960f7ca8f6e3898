"""Headless Chromium opens every page of the site built from real records: no console
errors, every internal link and anchor resolves, every SVG renders, the matrix has one row
per entry and one column per runtime, screenshots are not blank, and the pages read with
JavaScript disabled. Chromium comes from scripts/setup.sh (Debian's `chromium`): without it
these tests fail, they do not skip."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from linnet.zoo.registry import registry

from linnet.site.matrix import RUNTIMES
from tests.site.cdp import Browser, chromium
from tests.site.conftest import FAILING_ENTRY, pages
from tests.site.png import distinct_colors

FACTS = """JSON.stringify({
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  svgs: [...document.querySelectorAll('svg')].map(s => {
    const r = s.getBoundingClientRect();
    const drawn = [...s.querySelectorAll('rect')].filter(b => {
      const q = b.getBoundingClientRect(); return q.width > 0 && q.height > 0; });
    return {w: r.width, h: r.height, bars: s.querySelectorAll('rect').length,
            drawn: drawn.length};
  }),
  images: [...document.images].map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0})),
  stylesheets: document.styleSheets.length,
  text: document.body.innerText.length,
})"""

MATRIX = """JSON.stringify({
  rows: [...document.querySelectorAll('#matrix tbody tr')].map(
    tr => [tr.querySelector('th').innerText, ...[...tr.querySelectorAll('td')].map(
      td => td.querySelector('a').innerText)]),
  columns: [...document.querySelectorAll('#matrix thead th')].map(th => th.innerText),
})"""


@pytest.fixture(scope="module")
def binary() -> str:
    found = chromium()
    if found is None:
        pytest.fail("chromium is missing: scripts/setup.sh installs it (apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def visited(site, binary) -> dict[Path, dict]:
    """Every page opened once: its errors and what its DOM holds."""
    out = {}
    with Browser.start(binary) as browser:
        for page in pages(site):
            errors = browser.open(page.as_uri())
            facts = json.loads(browser.evaluate(FACTS))
            out[page] = {"errors": errors, **facts}
            if page.name == "matrix.html":
                out[page]["matrix"] = json.loads(browser.evaluate(MATRIX))
            if page.name in ("index.html", "gpt2.html"):
                clip = {"x": 0, "y": 0, "width": 1280, "height": 1000, "scale": 0.4}
                out[page]["shot"] = browser.call("Page.captureScreenshot", format="png", clip=clip)[
                    "data"
                ]
    return out


def test_every_page_opens_without_console_errors(visited):
    assert len(visited) >= len(list(registry())) + 4
    for page, facts in visited.items():
        assert facts["errors"] == [], page
        assert facts["stylesheets"] == 1 and facts["text"] > 200, page


def test_every_internal_link_and_anchor_resolves(visited, site):
    ids = {page.resolve(): set(facts["ids"]) for page, facts in visited.items()}
    checked = 0
    for page, facts in visited.items():
        for href in facts["links"]:
            url = urlsplit(href)
            assert url.scheme == "file", f"{page.name}: link out of the site: {href}"
            target = Path(unquote(url.path)).resolve()
            assert target.is_file(), f"{page.name}: {href} leads nowhere"
            assert site.resolve() in target.parents, f"{page.name}: {href} leaves the site"
            if url.fragment:
                assert target in ids, f"{page.name}: {href} is no page of the site"
                assert unquote(url.fragment) in ids[target], f"{page.name}: no anchor {href}"
            checked += 1
    assert checked > 100


def test_every_svg_and_image_renders(visited):
    charts = 0
    for page, facts in visited.items():
        for svg in facts["svgs"]:
            assert svg["w"] > 0 and svg["h"] > 0 and svg["bars"] > 0, page
            assert svg["drawn"] == svg["bars"], f"{page}: a bar does not render"
            charts += 1
        assert all(img["ok"] for img in facts["images"]), page
    assert charts > 0


def test_matrix_has_a_row_per_entry_and_a_column_per_runtime(visited, site):
    matrix = visited[site / "matrix.html"]["matrix"]
    names = [e.name for e in registry()]
    assert [row[0] for row in matrix["rows"]] == names
    assert [c.split("\n")[0] for c in matrix["columns"]] == ["model"] + [r.label for r in RUNTIMES]
    assert all(len(row) == 1 + len(RUNTIMES) for row in matrix["rows"])
    rows = {row[0]: dict(zip(["model"] + [r.key for r in RUNTIMES], row)) for row in matrix["rows"]}
    assert rows["gpt2"]["torch"] == "✓" and rows["gpt2"]["onnx"] == "✓"  # parity_ci's records
    assert rows[FAILING_ENTRY]["torch"] == "✕"  # the perturbed weight
    assert all(row["vllm"] == "not measured" for row in rows.values())  # no record at all


def test_screenshots_of_the_index_and_a_model_page_are_not_blank(visited, site):
    import base64

    for page in (site / "index.html", site / "models" / "gpt2.html"):
        shot = base64.b64decode(visited[page]["shot"])
        assert distinct_colors(shot) > 20, page


SCRIPT_PROBE = (
    "data:text/html,<p id='x'>off</p><script>document.getElementById('x').textContent='on'</script>"
)
NO_SCRIPT = [
    ("index.html", "gpt2"),
    ("matrix.html", "not measured"),
    ("models/gpt2.html", "gpt2.tiny.torch.f32.json"),
    ("bench/decoders.html", "decode"),
    ("language.html", "Layout"),
]


def test_pages_read_with_javascript_disabled(site, binary):
    """A browser started with scripts off (`--blink-settings=scriptEnabled=false`): each
    page's DOM after load still holds its content."""
    flag = "--blink-settings=scriptEnabled=false"
    with Browser.start(binary, (flag,)) as browser:
        probe = browser.html(SCRIPT_PROBE)
        doms = {name: browser.html((site / name).as_uri()) for name, _ in NO_SCRIPT}
    assert '<p id="x">off</p>' in probe  # the flag holds: the probe's script did not run
    # what a script or a template would only show with scripts on does not count
    doms = {k: re.sub(r"<(script|template)\b.*?</\1>", "", v, flags=re.S) for k, v in doms.items()}
    for name, needle in NO_SCRIPT:
        assert needle in doms[name] and "</main>" in doms[name], name
    assert doms["bench/decoders.html"].count("<svg") > 0
    matrix = doms["matrix.html"]
    assert matrix.count('<th scope="row">') == len(list(registry()))
