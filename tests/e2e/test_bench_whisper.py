"""bench/whisper.py itself, in its quick mode (a 1-layer checkpoint of whisper-tiny's
vocabulary and window, 4 tokens, one timed call): it runs end to end as a user calls it and
writes a well-formed results file, every method's tokens compared with transformers' (on the
same espeak-ng clip); its --profile mode writes each part's seconds. No timing is asserted."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "whisper.py"
METHODS = ["linnet/interpret", "transformers/eager", "ctranslate2/f32"]


def run_bench(out: Path, *extra: str, methods=METHODS) -> dict:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing: scripts/setup.sh installs it")
    pytest.importorskip("ctranslate2")
    only = [a for m in methods for a in ("--only", m)]
    cmd = [sys.executable, str(SCRIPT), "--quick", "--out", str(out), *only, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def finite_positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_quick_run_writes_a_well_formed_record(tmp_path):
    record = run_bench(tmp_path / "whisper.json")
    assert record["quick"] is True and record["new_tokens"] == 4 and record["repeats"] == 1
    assert 9 < record["audio"]["seconds"] < 11  # the espeak-ng clip
    assert sorted(record["results"]) == sorted(METHODS)
    assert "load" in json.dumps(record["machine"]) and len(record["load_average_end"]) == 3
    for name, cell in record["results"].items():
        assert "error" not in cell, (name, cell.get("error"), cell.get("trace"))
        for key in ("setup_s", "first_call_s", "best_s", "median_s"):
            assert finite_positive(cell[key]), (name, key, cell[key])
        assert len(cell["tokens"]) == 4 and all(isinstance(t, int) for t in cell["tokens"])
        assert cell["same_tokens"] is True, name  # against transformers' generate
        assert math.isclose(cell["realtime_x"], record["audio"]["seconds"] / cell["best_s"])
    goals = {g["goal"].split(" >= ")[1].split("x ")[0] for g in record["goals"]}
    assert goals == {"1.5", "1.0"}


def test_profile_writes_each_part(tmp_path):
    record = run_bench(tmp_path / "profile.json", "--profile")  # transformers: not profiled
    parts = record["profile"]
    assert sorted(parts) == ["ctranslate2/f32", "linnet/interpret"]
    for name in ("linnet/interpret",):
        cell = parts[name]
        assert "error" not in cell, cell
        assert all(finite_positive(cell[k]) for k in ("front_s", "encode_s", "prefill_s", "step_s"))
        assert cell["steps"] == 3
    cell = parts["ctranslate2/f32"]
    assert "error" not in cell, cell
    assert all(finite_positive(cell[k]) for k in ("front_s", "encode_s", "decode_s", "step_s"))
    assert cell["tokens"] == 4
