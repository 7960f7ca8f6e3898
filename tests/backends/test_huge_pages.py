"""The weights in one MADV_HUGEPAGE mapping (huge_pages.py; docs/torch.md):

- the generated runner moves every weight storage into one mapping the kernel was told
  to back with huge pages (`hg` in its VmFlags), starting on a 2 MB boundary; the logits
  are the bits of the same model with LINNET_HUGE_PAGES=0, which moves nothing;
- what shared a storage still does (a stack's parts, a tied head and embedding), a
  tensor held in two places is one tensor after, and a view's old base is freed;
- a packed weight's parts (q8_0) move and decode as before; tensors that need grads,
  and storages under MIN_BYTES, stay;
- with slow faults, `auto` leaves the pages after the first to 4 KB pages, or moves
  nothing where under a quarter came huge; `always` takes them all.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import linnet.torch as lt
from linnet.backends.torch import huge_pages
from linnet.backends.torch.huge_pages import HUGE, hold_in_huge_pages, slots
from tests.checkpoints import build_tiny, probe_ids


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process holding `address`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def _decode(model, steps=3):
    ids = probe_ids(model.hf_config["vocab_size"])[:1]
    model.reset()
    outs = [model.decode(ids, 0)]
    for _ in range(steps):
        outs.append(model.decode(outs[-1].argmax(-1)[:, None], model.position))
    return outs


def _storages(model) -> dict:
    return {d[k].untyped_storage().data_ptr() for d, k in slots(model.runner.module, {})}


@pytest.fixture
def everything(monkeypatch):
    """Every storage moves, however small (the tiny models' weights are a few KB)."""
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "q8_0"])
def test_runner_weights_in_one_huge_page_mapping_same_bits(everything, monkeypatch, dtype):
    folder = str(build_tiny("llama", "base"))
    model = lt.load(folder, mode="generated", numerics="fast", dtype=dtype)
    (storage,) = _storages(model)  # one mapping for all
    first = min(d[k].data_ptr() for d, k in slots(model.runner.module, model.params))
    assert first % HUGE == 0
    assert "hg" in _vm_flags(first)
    if dtype == "q8_0":
        packed = [v for v in model.params.values() if hasattr(v, "codes")]
        assert packed and all(p.codes.untyped_storage().data_ptr() == storage for p in packed)
    monkeypatch.setenv("LINNET_HUGE_PAGES", "0")
    plain = lt.load(folder, mode="generated", numerics="fast", dtype=dtype)
    assert storage not in _storages(plain) and len(_storages(plain)) > 1
    assert all(torch.equal(a, b) for a, b in zip(_decode(model), _decode(plain)))


def test_tied_and_stacked_weights_still_share(everything):
    """The tied embedding and head stay one tensor's bytes, and a stack's parts in the
    model's params stay views of the stack the module reads."""
    model = lt.load(str(build_tiny("llama", "tied")), mode="generated", numerics="fast")
    module, params = model.runner.module, model.params
    stack = module.layers[0].wq_wk_wv
    lo, hi = stack.data_ptr(), stack.data_ptr() + stack.numel() * stack.element_size()
    parts = [params[f"layers.0.{name}"] for name in ("wq", "wk", "wv")]
    assert all(lo <= p.data_ptr() < hi for p in parts)
    assert params["embed"].data_ptr() in {t.data_ptr() for t in module.state_dict().values()}


def test_one_tensor_in_two_places_stays_one_and_old_bases_are_freed(everything):
    flat = torch.randn(3 * 64)
    base = weakref.ref(flat)
    module = torch.nn.Module()
    module.register_buffer("w", flat.view(3, 64)[1:])  # a view: its base is `flat`
    params = {"w": module.w, "same": module.w, "grad": torch.randn(64, requires_grad=True)}
    grad_ptr = params["grad"].data_ptr()
    want = module.w.clone()
    del flat
    assert hold_in_huge_pages(module, params) > 0
    gc.collect()
    assert base() is None  # nothing keeps the old storage
    assert params["w"] is params["same"] is module.w
    assert torch.equal(module.w, want) and module.w.stride() == (64, 1)
    assert params["grad"].data_ptr() == grad_ptr  # a tensor that needs grads stays


def test_small_storages_and_switched_off_stay(monkeypatch):
    module = torch.nn.Module()
    module.register_buffer("norm", torch.randn(576))  # 2304 bytes: under MIN_BYTES
    ptr = module.norm.data_ptr()
    assert hold_in_huge_pages(module, {}) == 0 and module.norm.data_ptr() == ptr
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    monkeypatch.setenv("LINNET_HUGE_PAGES", "0")
    assert hold_in_huge_pages(module, {}) == 0 and module.norm.data_ptr() == ptr


@pytest.mark.parametrize("setting", ["auto", "always"])
def test_slow_faults_leave_the_rest_to_small_pages_unless_always(monkeypatch, setting):
    """Every fault counted slow: `auto` keeps the first 2 MB page and marks the rest
    MADV_NOHUGEPAGE (`nh`); `always` keeps them all huge. The copy reads the same."""
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    monkeypatch.setattr(huge_pages, "SLOW_FAULT_S", -1.0)
    monkeypatch.setenv("LINNET_HUGE_PAGES", setting)
    module = torch.nn.Module()
    module.register_buffer("w", torch.randn(3 * HUGE // 4))  # 6 MB: three 2 MB pages
    want = module.w.clone()
    hold_in_huge_pages(module, {})
    first = module.w.data_ptr()
    assert "hg" in _vm_flags(first)
    later = _vm_flags(first + 2 * HUGE)
    assert ("nh" in later) == (setting == "auto") and ("hg" in later) == (setting == "always")
    assert torch.equal(module.w, want)


def test_auto_moves_nothing_when_few_pages_come_huge(monkeypatch):
    """`auto`, every fault slow: of a 10 MB storage only the first 2 MB page would be
    huge (under a quarter), so the storage stays where it was."""
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    monkeypatch.setattr(huge_pages, "SLOW_FAULT_S", -1.0)
    module = torch.nn.Module()
    module.register_buffer("w", torch.randn(5 * HUGE // 4))
    ptr = module.w.data_ptr()
    assert hold_in_huge_pages(module, {}) == 0 and module.w.data_ptr() == ptr
