"""Strict skips: in CI a skipped test is a failure unless it needs hardware CI lacks.

On when `LINNET_STRICT_SKIPS=1`, or when `CI` is set (and `LINNET_STRICT_SKIPS` is not
`0`); scripts/test.sh turns it on. Then every skip (a test's `skip`/`skipif`, or a module's
`importorskip` at collection) is collected, and the session fails with their list, unless
the test is marked `gpu` and its reason is one of `ALLOWED_REASONS`. Deselected tests
(`-m "not slow"`) are not skips. Loaded by tests/conftest.py; `-p tests.skip_policy` loads
it into any other pytest session (its own test does so).
"""

from __future__ import annotations

import os

import pytest

#: Reasons a `gpu`-marked test may give for skipping on a machine without one.
ALLOWED_REASONS = frozenset(
    {
        "CUDA graphs need a CUDA device",
        "layers on a CUDA device need CUDA",
        "parity on a GPU needs a CUDA device",
        "tensor parallel over NCCL needs two CUDA devices",
    }
)
PLUGIN_NAME = "linnet-skip-policy"


def strict() -> bool:
    flag = os.environ.get("LINNET_STRICT_SKIPS", "")
    if flag in ("0", "1"):
        return flag == "1"
    return bool(os.environ.get("CI"))


def skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


class SkipPolicy:
    def __init__(self) -> None:
        self.refused: list[tuple[str, str]] = []  # (test or module, reason)

    def _see(self, report) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        reason = skip_reason(report)
        if "gpu" in getattr(report, "keywords", ()) and reason in ALLOWED_REASONS:
            return
        self.refused.append((report.nodeid, reason))

    def pytest_collectreport(self, report) -> None:
        self._see(report)

    def pytest_runtest_logreport(self, report) -> None:
        self._see(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session) -> None:
        if self.refused and session.exitstatus in (pytest.ExitCode.OK, 5):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.refused:
            return
        tr = terminalreporter
        tr.section("skips refused (LINNET_STRICT_SKIPS / CI)", red=True, bold=True)
        for nodeid, reason in self.refused:
            tr.line(f"SKIPPED {nodeid}: {reason}", red=True)
        tr.line(
            f"{len(self.refused)} skip(s) fail this session: only `gpu`-marked tests may skip, "
            f"for {sorted(ALLOWED_REASONS)}; install what is missing (scripts/setup.sh)",
            red=True,
        )


def pytest_configure(config) -> None:
    if strict() and not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(SkipPolicy(), PLUGIN_NAME)
