"""`linnet site build` from records made in the test (scripts/parity_ci.py on gpt2, and a
gate failed on purpose): pages well-formed, tables with header cells, charts with a text
alternative, figures and provenance as the records hold them, no torch imported, and a
broken record failing the build with a message naming the file."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import html5lib
import pytest
from linnet.zoo.registry import registry

from tests.site.conftest import FAILING_ENTRY, ROOT, pages, run_linnet

XHTML = "{http://www.w3.org/1999/xhtml}"
SVG = "{http://www.w3.org/2000/svg}"


def parse(page: Path):
    """html5lib in strict mode: any parse error raises."""
    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=True)
    return parser.parse(page.read_bytes())


def test_every_page_is_well_formed_html_and_xml(site):
    assert len(pages(site)) == len(list(registry())) + 9  # index, matrix, language, 6 bench
    for page in pages(site):
        parse(page)
        text = page.read_text(encoding="utf-8")
        ET.fromstring(text.removeprefix("<!DOCTYPE html>"))  # polyglot: every tag closed


def test_every_table_has_header_cells_and_every_chart_a_text_alternative(site):
    charts = 0
    for page in pages(site):
        tree = parse(page)
        for table in tree.iter(f"{XHTML}table"):
            assert list(table.iter(f"{XHTML}th")), f"{page}: a table without header cells"
        for svg in tree.iter(f"{SVG}svg"):
            title = svg.find(f"{SVG}title")
            assert svg.get("aria-label") and title is not None and title.text, page
            assert svg.get("role") == "img"
            charts += 1
    assert charts > 0


def _record(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def test_model_page_shows_each_record_with_its_figures_and_provenance(site, parity_records):
    page = (site / "models" / "gpt2.html").read_text(encoding="utf-8")
    files = sorted(p.name for p in parity_records.glob("gpt2.*.json"))
    assert len(files) == 4  # torch f32 and bf16, jax f32, onnx f32
    for name in files:
        rec = _record(parity_records, name)
        worst = max(f["max_abs"] for f in rec["figures"])
        assert name in page and f"{worst:.2e}" in page
        assert rec["command"].startswith("python scripts/parity_ci.py --only gpt2 --no-real")
        assert rec["date"] in page and rec["command"] in page.replace("&#39;", "'")
        assert rec["machine"]["platform"] in page
    assert "no sample output recorded" in page  # tiny random weights have no tokenizer
    plan = rec["plan"].splitlines()  # `linnet plan` of the checkpoint the record was made on
    assert plan[0].startswith("architecture") and "GPT2LMHeadModel" in plan[0]
    assert "no checkpoint here" not in page and html.escape(plan[-1], quote=False) in page
    assert 'class="keyword">model</span> gpt2' in page  # the source, highlighted
    assert "weights_maps/gpt2.toml" in page and "linnet zoo pull gpt2" in page


def test_a_failed_record_shows_why_and_an_entry_without_records_says_not_measured(
    site, parity_records
):
    rec = _record(parity_records, f"{FAILING_ENTRY}.tiny.torch.f32.json")
    assert rec["passed"] is False
    why = rec["figures"][0]["why"]
    matrix = (site / "matrix.html").read_text(encoding="utf-8")
    assert why and why in html.unescape(matrix)  # the cell says why, not only ✕
    page = (site / "models" / "qwen3-8b.html").read_text(encoding="utf-8")
    assert "not measured: no parity record names qwen3-8b" in page
    index = (site / "index.html").read_text(encoding="utf-8")
    card = index.split('id="entry-qwen3-8b"')[1].split("</li>")[0]
    assert "parity: not measured" in card


def test_benchmark_pages_show_every_row_and_where_it_was_measured(site):
    decoders = (site / "bench" / "decoders.html").read_text(encoding="utf-8")
    data = json.loads((ROOT / "bench" / "results" / "latest.json").read_text())
    for dtype, methods in data["results"].items():
        for method, row in methods.items():
            if "decode_tok_s" in row:
                assert re.search(rf"<td>{re.escape(method)}</td><td>{dtype}</td>", decoders)
    assert data["machine"]["platform"] in decoders and data["versions"]["torch"] in decoders
    assert "★ best" in decoders


def test_build_imports_neither_torch_nor_transformers(parity_records, tmp_path):
    code = (
        "import sys\n"
        "from linnet.site.build import Inputs, build_site\n"
        f"build_site({str(tmp_path / 'out')!r}, Inputs.default({str(parity_records)!r}))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "out" / "index.html").is_file()


def test_an_old_record_without_machine_or_command_shows_unknown(parity_records, tmp_path):
    old = tmp_path / "records"
    old.mkdir()
    rec = _record(parity_records, "gpt2.tiny.torch.f32.json")
    del rec["machine"], rec["command"]  # as records were written before they had them
    (old / "gpt2.tiny.torch.f32.json").write_text(json.dumps(rec))
    done = run_linnet("site", "build", "--out", str(tmp_path / "out"), "--results", str(old))
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "models" / "gpt2.html").read_text(encoding="utf-8")
    made = page.split('id="record-1"')[1].split("</dl>")[0]
    assert "<dt>machine</dt><dd>unknown</dd>" in made
    assert "<dt>command</dt><dd><code>unknown</code></dd>" in made


BROKEN = {
    "bad JSON": ("gpt2.tiny.torch.f32.json", '{"entry": "gpt2", ', "not valid JSON"),
    "unknown entry": ("nope.tiny.torch.f32.json", None, "'no-such-model', which is no zoo entry"),
    "not an object": ("gpt2.tiny.jax.f32.json", "[1, 2]", "expected a JSON object"),
    "no verdict": ("gpt2.tiny.onnx.f32.json", "drop passed", "field 'passed'"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_parity_record_fails_the_build_naming_the_file(case, parity_records, tmp_path):
    name, text, message = BROKEN[case]
    folder = tmp_path / "records"
    shutil.copytree(parity_records, folder)
    rec = _record(parity_records, "gpt2.tiny.torch.f32.json")
    if text is None:
        text = json.dumps({**rec, "entry": "no-such-model"})
    elif text == "drop passed":
        text = json.dumps({k: v for k, v in rec.items() if k != "passed"})
    (folder / name).write_text(text)
    out = tmp_path / "out"
    done = run_linnet("site", "build", "--out", str(out), "--results", str(folder))
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: {folder / name}: ") and message in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_a_broken_benchmark_result_fails_the_build_naming_the_file(parity_records, tmp_path):
    bench = tmp_path / "bench"
    shutil.copytree(ROOT / "bench" / "results", bench, ignore=shutil.ignore_patterns("gguf"))
    (bench / "odd.json").write_text('{"rows": []}')
    args = ("--results", str(parity_records), "--bench", str(bench))
    done = run_linnet("site", "build", "--out", str(tmp_path / "out"), *args)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{bench / 'odd.json'}: not a benchmark result" in done.stderr


def test_build_never_empties_a_folder_it_did_not_write(parity_records, tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    done = run_linnet("site", "build", "--out", str(keep), "--results", str(parity_records))
    assert done.returncode == 1 and "not an earlier site build" in done.stderr
    assert (keep / "notes.txt").read_text() == "mine"


def test_a_record_names_the_command_as_a_user_typed_it():
    from linnet.parity.records import command

    assert command(["/x/.venv/bin/linnet", "parity", "gpt2", "--dtype", "bf16"]) == (
        "linnet parity gpt2 --dtype bf16"
    )
    assert command(["scripts/parity_ci.py", "--only", "a b"]) == (
        "python scripts/parity_ci.py --only 'a b'"
    )
