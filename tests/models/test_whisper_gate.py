"""The speech parity gate (linnet/parity/speech.py) sees Whisper's decoding rules.

The `first` output compares the first generated step's scores after the checkpoint's rules
with the scores transformers' `generate` processed: a begin-suppress (or suppress) rule that
Linnet drops or applies to other tokens fails it, even where greedy decoding would not have
picked a begin-suppressed token (what `greedy` alone could not see). On parity CI's tiny
whisper-tiny (zoo/scaled.py: begin-suppress of two special tokens).
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")

from linnet.zoo import get  # noqa: E402

import linnet.speech as speech  # noqa: E402
from linnet.parity import run_gate  # noqa: E402
from tests.zoo.test_parity_gate import parity_ci  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return parity_ci().build_tiny(get("whisper-tiny"), tmp_path_factory.mktemp("gate"))


def first_verdict(folder):
    report = run_gate(folder, entry=get("whisper-tiny"), weights="tiny-random")
    return report, {f.output: f for f in report.figures}["first"]


def test_first_step_scores_pass_with_the_rules(folder):
    report, first = first_verdict(folder)
    assert report.passed, [f.why for f in report.figures]
    assert first.max_abs < 1e-4 and first.top1 == first.rows == 2


@pytest.mark.parametrize(
    "broken",
    [
        dict(begin_suppress=[]),  # the rule dropped
        dict(suppress=[]),  # suppress_tokens ignored
    ],
    ids=["no begin-suppress", "no suppress"],
)
def test_a_dropped_rule_fails_the_gate(folder, monkeypatch, broken):
    rule_scores = speech.rule_scores

    def without(logits, rules, out, timestamps):
        return rule_scores(logits, dataclasses.replace(rules, **broken), out, timestamps)

    monkeypatch.setattr(speech, "rule_scores", without)
    report, first = first_verdict(folder)
    assert not report.passed and not first.passed
    assert "suppressed on one side only" in first.why, first.why


def test_begin_suppress_of_other_tokens_fails_the_gate(folder, monkeypatch):
    """Begin-suppress shifted to the next ids: as many tokens off, the wrong ones."""
    rule_scores = speech.rule_scores

    def shifted(logits, rules, out, timestamps):
        moved = [t + 1 for t in rules.begin_suppress]
        return rule_scores(logits, dataclasses.replace(rules, begin_suppress=moved), out,
                           timestamps)  # fmt: skip

    monkeypatch.setattr(speech, "rule_scores", shifted)
    report, first = first_verdict(folder)
    assert not first.passed and "suppressed on one side only" in first.why
