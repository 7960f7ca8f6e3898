"""The strict-skip policy (tests/skip_policy.py), run on a small suite of its own in a
pytest subprocess: each skip CI must not accept fails the session, named with its reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SUITE = {
    "test_runs.py": """
import pytest

def test_passes():
    assert True

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="CUDA graphs need a CUDA device")
def test_gpu_only():
    pass

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="some other reason")
def test_gpu_marked_but_skips_for_another_reason():
    pass

def test_skips_at_run_time():
    pytest.skip("the reference is not installed")
""",
    "test_module_skip.py": """
import pytest
pytest.importorskip("linnet_no_such_module")

def test_never_collected():
    pass
""",
    "test_xfail.py": """
import pytest

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
""",
}


def run_suite(tmp_path: Path, strict: str | None, ci: str | None = None):
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "LINNET_STRICT_SKIPS")}
    env["PYTHONPATH"] = str(REPO)
    env |= {k: v for k, v in (("LINNET_STRICT_SKIPS", strict), ("CI", ci)) if v is not None}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "tests.skip_policy", "-o", "markers=gpu: needs a CUDA device", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def refused(stdout: str) -> list[str]:
    return sorted(ln.split(": ", 1)[0] for ln in stdout.splitlines() if ln.startswith("SKIPPED "))


@pytest.mark.parametrize("strict, ci", [("1", None), (None, "true")], ids=["flag", "ci"])
def test_strict_session_fails_on_skips_and_names_them(tmp_path, strict, ci):
    done = run_suite(tmp_path, strict, ci)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "skips refused" in done.stdout
    assert refused(done.stdout) == [
        "SKIPPED test_module_skip.py",
        "SKIPPED test_runs.py::test_gpu_marked_but_skips_for_another_reason",
        "SKIPPED test_runs.py::test_skips_at_run_time",
    ]
    assert "test_runs.py::test_skips_at_run_time: the reference is not installed" in done.stdout
    assert "could not import 'linnet_no_such_module'" in done.stdout
    assert "1 passed" in done.stdout and "1 xfailed" in done.stdout


@pytest.mark.parametrize("strict, ci", [(None, None), ("0", "true")], ids=["default", "off"])
def test_skips_pass_when_the_policy_is_off(tmp_path, strict, ci):
    done = run_suite(tmp_path, strict, ci)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skips refused" not in done.stdout and "4 skipped" in done.stdout
