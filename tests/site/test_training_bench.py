"""bench/train.py's record on the site (issue 17): every run of bench/results/training.json
becomes a row of the training suite with the record's own figures; a failed run is a row
that says why; a malformed training record stops the build naming the file."""

from __future__ import annotations

import json
import shutil

import pytest

from linnet.site.bench import SiteError, read_bench
from tests.site.conftest import ROOT

RECORD = ROOT / "bench" / "results" / "training.json"
# what bench/train.py writes per run and the site shows
FIGURES = ("step_s", "tokens_s", "peak_rss_mb", "final_loss", "heldout_loss", "mean_reward")


def suite_of_folder(folder):
    suites = {s.key: s for s in read_bench(folder, lambda name: None)}
    return suites["training"]


def test_every_run_is_a_row_with_the_record_figures(tmp_path):
    shutil.copy(RECORD, tmp_path / "training.json")
    data = json.loads(RECORD.read_text())
    suite = suite_of_folder(tmp_path)
    rows = {(r.config, r.method): r for r in suite.rows}
    runs = [
        (kind, method, cell)
        for kind, cells in data["runs"].items()
        for method, cell in cells.items()
    ]
    assert len(rows) == len(runs) and runs
    for kind, method, cell in runs:
        row = rows[(f"LoRA {kind.upper()}", method)]
        assert row.ok == ("error" not in cell)
        for key in FIGURES:
            if isinstance(cell.get(key), float | int):
                assert row.figures.get(key) == cell[key], (kind, method, key)
        if "vs" in cell:
            assert f"vs trl: {cell['vs']['trl']:.2f}×" in row.notes


def test_a_failed_run_is_a_row_that_says_why(tmp_path):
    data = json.loads(RECORD.read_text())
    data["runs"]["sft"]["trl"] = {"error": "ValueError: something broke"}
    (tmp_path / "training.json").write_text(json.dumps(data))
    row = next(r for r in suite_of_folder(tmp_path).rows if r.method == "trl" and "SFT" in r.config)
    assert not row.ok and "something broke" in row.notes and not row.figures


@pytest.mark.parametrize("runs", [[], {"sft": []}, {"sft": {"trl": 3}}])
def test_a_malformed_training_record_names_the_file(tmp_path, runs):
    data = json.loads(RECORD.read_text())
    data["runs"] = runs
    path = tmp_path / "training.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SiteError, match="training.json"):
        read_bench(tmp_path, lambda name: None)


def test_the_training_page_shows_the_loss_plot(site):
    """The record's `plot` (docs/training-loss.svg) is copied beside bench/training.html,
    byte for byte, and the page shows it."""
    plot = ROOT / json.loads(RECORD.read_text())["plot"]
    copied = site / "bench" / plot.name
    assert copied.read_bytes() == plot.read_bytes()
    page = (site / "bench" / "training.html").read_text()
    assert f'<img src="{plot.name}"' in page
