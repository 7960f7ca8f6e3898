"""The weights in one MADV_HUGEPAGE mapping (huge_pages.py; docs/torch.md):

- the generated runner moves every weight storage into one mapping the kernel was told
  to back with huge pages (`hg` in its VmFlags), starting on a 2 MB boundary; the logits
  are the bits of the same model with LINNET_HUGE_PAGES=0, which moves nothing;
- what shared a storage still does (a stack's parts, a tied head and embedding), a
  tensor held in two places is one tensor after, and a view's old base is freed;
- a packed weight's parts (q8_0) move and decode as before; tensors that need grads,
  and storages under MIN_BYTES, stay;
- with slow faults, `auto` moves nothing from the first slow page on (those storages
  stay, the pages it faulted for them are handed back); `always` takes them all;
- the load's anonymous memory grows by about one storage while the weights move, not by
  the weights again.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import linnet.torch as lt
from linnet.backends.torch import huge_pages
from linnet.backends.torch.huge_pages import HUGE, hold_in_huge_pages, slots
from tests.checkpoints import build_tiny, greedy_steps


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


def _storages(model) -> dict:
    return {d[k].untyped_storage().data_ptr() for d, k in slots(model.runner.module, {})}


@pytest.fixture
def everything(monkeypatch):
    """Every storage moves, however small (the tiny models' weights are a few KB) and
    however slowly its 2 MB page comes (`auto` would move nothing where the first is
    slow: a VM whose host backs memory lazily, or a loaded machine)."""
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    monkeypatch.setenv("LINNET_HUGE_PAGES", "always")


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
    assert all(torch.equal(a, b) for a, b in zip(greedy_steps(model), greedy_steps(plain)))


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


def test_a_slice_moves_only_the_bytes_it_reads(everything):
    """A rank's slice of a tensor is a view of the whole: only its rows move (from a 4 KB
    boundary of the old storage, so each tensor lies at its old offset's alignment), a
    transposed view of them with them."""
    whole = torch.randn(4096, 256)  # 1 KiB a row
    module = torch.nn.Module()
    module.register_buffer("w", whole[1001:2000])
    module.register_buffer("t", whole[1500:1600].t())
    want = [module.w.clone(), module.t.clone()]
    lo = 1001 * 1024 // 4096 * 4096
    assert hold_in_huge_pages(module, {}) == 2000 * 1024 - lo
    assert module.w.untyped_storage().data_ptr() == module.t.untyped_storage().data_ptr()
    assert module.w.data_ptr() % 4096 == 1001 * 1024 % 4096  # as in the old storage
    assert torch.equal(module.w, want[0]) and torch.equal(module.t, want[1])
    assert module.t.stride() == (1, 256)


def test_small_storages_and_switched_off_stay(monkeypatch):
    module = torch.nn.Module()
    module.register_buffer("norm", torch.randn(576))  # 2304 bytes: under MIN_BYTES
    ptr = module.norm.data_ptr()
    assert hold_in_huge_pages(module, {}) == 0 and module.norm.data_ptr() == ptr
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    monkeypatch.setenv("LINNET_HUGE_PAGES", "0")
    assert hold_in_huge_pages(module, {}) == 0 and module.norm.data_ptr() == ptr


def _anon_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def _held_in(module) -> set:
    return {t.untyped_storage().data_ptr() for t in module.buffers()}


def test_always_moves_every_storage_into_huge_pages(monkeypatch):
    """Every fault counted slow, `always` still moves both storages into one mapping
    whose pages are all `hg`; the copies read the same."""
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    monkeypatch.setattr(huge_pages, "SLOW_FAULT_S", -1.0)
    monkeypatch.setenv("LINNET_HUGE_PAGES", "always")
    module = torch.nn.Module()
    module.register_buffer("a", torch.randn(3 * HUGE // 4))  # 6 MB: three 2 MB pages
    module.register_buffer("b", torch.randn(HUGE // 4))
    want = [t.clone() for t in module.buffers()]
    assert hold_in_huge_pages(module, {}) == 8 * HUGE // 2
    assert len(_held_in(module)) == 1
    assert all("hg" in _vm_flags(module.a.data_ptr() + i * HUGE) for i in range(4))
    assert all(torch.equal(a, b) for a, b in zip(module.buffers(), want))


def test_auto_stops_at_the_first_slow_page(monkeypatch):
    """`auto`: the first storage's pages come fast and it moves; the second's first page
    is slow, so it stays where it was, and the rest of the mapping is `nh` and not held
    (the page faulted for it handed back)."""
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    faults = []

    def clock():  # the fourth fault (the second storage's first page) takes 1 s
        faults.append(None)
        return 1.0 if len(faults) == 8 else 0.0

    monkeypatch.setattr(huge_pages, "_now", clock)
    module = torch.nn.Module()
    module.register_buffer("a", torch.randn(3 * HUGE // 4))  # 6 MB: three 2 MB pages
    module.register_buffer("b", torch.randn(3 * HUGE // 4))
    b_ptr, want = module.b.data_ptr(), module.a.clone()
    assert hold_in_huge_pages(module, {}) == 6 * HUGE // 2
    assert module.b.data_ptr() == b_ptr and torch.equal(module.a, want)
    assert "hg" in _vm_flags(module.a.data_ptr())
    after = module.a.data_ptr() + 3 * HUGE
    assert "nh" in _vm_flags(after)
    assert _resident(after, 2) == 0


def test_auto_moves_nothing_when_the_first_page_is_slow(monkeypatch):
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    monkeypatch.setattr(huge_pages, "SLOW_FAULT_S", -1.0)
    module = torch.nn.Module()
    module.register_buffer("w", torch.randn(5 * HUGE // 4))
    ptr = module.w.data_ptr()
    assert hold_in_huge_pages(module, {}) == 0 and module.w.data_ptr() == ptr


def test_memory_grows_by_about_one_storage_while_moving(monkeypatch):
    """Eight 8 MB storages (64 MB): while they move, anonymous memory stays within three
    storages of where it started: the one moving, and up to TRIM_BYTES freed but not yet
    handed back (faulting the whole mapping in first, it grew 64 MB)."""
    monkeypatch.setenv("LINNET_HUGE_PAGES", "always")
    module = torch.nn.Module()
    for i in range(8):
        module.register_buffer(f"w{i}", torch.randn(2 << 20))  # 8 MB, its own mmap
    before, peak = _anon_kb(), 0
    move = huge_pages._move

    def watched(*args):
        nonlocal peak
        move(*args)
        peak = max(peak, _anon_kb() - before)

    monkeypatch.setattr(huge_pages, "_move", watched)
    assert hold_in_huge_pages(module, {}) == 64 << 20
    assert peak < 3 * 8 << 10, peak  # KB (measured 7-8 MB)


def _resident(address: int, pages: int) -> int:
    """How many of the 2 MB pages from `address` have any 4 KB page in memory (mincore
    through /proc/self/pagemap needs no privilege for the present bit)."""
    import struct

    present = 0
    with open("/proc/self/pagemap", "rb") as f:
        for i in range(pages):
            f.seek((address + i * HUGE) // 4096 * 8)
            entries = struct.unpack(f"{HUGE // 4096}Q", f.read(HUGE // 4096 * 8))
            present += any(e >> 63 for e in entries)
    return present
