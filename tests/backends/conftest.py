"""Fixtures of the C++ step-op tests (test_decode_ops.py, test_row_attention.py,
test_step_fusion.py): the built op namespace, and a spy that counts which ops the fast
helpers call."""

from __future__ import annotations

import pytest

from linnet.backends.torch import kernels


@pytest.fixture(scope="module")
def ops():
    ops = kernels.load()
    assert ops is not None, "the C++ kernels did not build (see the warning)"
    return ops


class Spy:
    """The op namespace, counting calls by op name."""

    def __init__(self, ops):
        self.ops, self.calls = ops, {}

    def __getattr__(self, name):
        op = getattr(self.ops, name)

        def counted(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return op(*args)

        return counted


@pytest.fixture
def spy(ops, monkeypatch):
    """Counts the ops the helpers call; None where `step_ops` answers None."""
    spy, real = Spy(ops), kernels.step_ops
    monkeypatch.setattr(kernels, "step_ops", lambda: spy if real() is not None else None)
    return spy


@pytest.fixture(params=[0, 1], ids=["intel-choices", "amd-choices"])
def amd_tuning(request):
    """Both sides of kernels/cpu_tuning.h on this machine: its AMD choices forced off (0)
    and on (1) for the test, the CPU's own choice restored after. Where the kernels do not
    load there is nothing to force (the tests check the fallback)."""
    if kernels.load() is None:
        yield request.param
        return
    before = kernels.force_amd_tuning(request.param)
    try:
        yield request.param
    finally:
        kernels.force_amd_tuning(before)
