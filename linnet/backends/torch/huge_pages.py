"""A CPU model's weights in transparent huge pages (Linux).

A decode step streams every weight once (SmolLM2-135M: 540 MB in f32), and with 4 KB
pages each 4 KB of it is a TLB entry: hundreds of thousands of page walks a step. Where
the kernel's THP setting is `madvise` (the common default: `always` is rare), torch's
allocations get 4 KB pages unless torch was started with THP_MEM_ALLOC_ENABLE=1.
`hold_in_huge_pages` copies the weights' storages into one anonymous mapping marked
MADV_HUGEPAGE, aligned to 2 MB, and points every tensor that shared a storage at its
copy (views stay views, a tied weight stays one), so the old storages are freed. On
sessions 16-21's AVX-512 Xeon SmolLM2's decode step took 0-16% less time with every
weight in 2 MB pages (bf16 14%, q8_0 16%, f32 3%, q4_0 none: docs/torch.md, "Session
21"). Values and layouts do not change: only where the bytes lie.

The pages are faulted in one by one before the copy (`_populate`): where a 2 MB page is
slow to come (a VM whose memory the host backs lazily), the rest get 4 KB pages, so
loading does not wait seconds for them, and where under a quarter came as 2 MB pages
nothing moves. LINNET_HUGE_PAGES=always takes them however slow (a server that loads
once), LINNET_HUGE_PAGES=0 keeps torch's allocations (an A/B); elsewhere than Linux
nothing moves.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time

import torch

from linnet.backends.torch.kernels import OFF_VALUES
from linnet.backends.torch.packed_tensor import PackedTensor

HUGE = 2 << 20  # x86-64's PMD huge page
ALIGN = 4096  # each storage's start in the mapping: page-aligned, as big allocations are
MIN_BYTES = 64 << 10  # smaller storages (norm weights, biases) stay where they are
SLOW_FAULT_S = 0.004  # a 2 MB page fault this slow: the kernel has none at hand (_populate)


def mode() -> str:
    """ "off" (LINNET_HUGE_PAGES=0, or no madvise here: not Linux), "always" (every 2 MB
    page however long its fault takes) or "auto" (the default: until one is slow)."""
    value = os.environ.get("LINNET_HUGE_PAGES", "auto").strip().lower()
    if value in OFF_VALUES or not (
        hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap.mmap, "madvise")
    ):
        return "off"
    return "always" if value == "always" else "auto"


def slots(module: torch.nn.Module, params: dict) -> list[tuple[dict, str]]:
    """Every (dict, key) holding a weight's tensor: the module's parameters and buffers,
    `params`' entries, and a packed weight's parts (its codes, scales, offsets)."""
    found = []
    for sub in module.modules():
        found += [(d, k) for d in (sub._parameters, sub._buffers) for k in d]
    found += [(params, k) for k in params]
    packed = [d[k] for d, k in found if isinstance(d[k], PackedTensor)]
    for value in {id(v): v for v in packed}.values():
        found += [(vars(value), k) for k, v in vars(value).items() if type(v) is torch.Tensor]
    return [(d, k) for d, k in found if type(d[k]) in (torch.Tensor, torch.nn.Parameter)]


def hold_in_huge_pages(module: torch.nn.Module, params: dict) -> int:
    """Moves the CPU storages of at least MIN_BYTES that the module's and `params`' weights
    read into one MADV_HUGEPAGE mapping; returns the bytes moved (0: nothing moved).

    Each slot gets a new tensor over the copy (one per old tensor object, so two slots
    that held one object still do): setting the old tensor on the new storage in place
    would keep a view's base, and with it the old storage, alive."""
    setting = mode()
    if setting == "off":
        return 0
    by_storage: dict[int, list[tuple[dict, str]]] = {}
    for d, k in slots(module, params):
        t = d[k]
        storage = t.untyped_storage()
        if t.device.type == "cpu" and storage.nbytes() >= MIN_BYTES and not t.requires_grad:
            by_storage.setdefault(storage.data_ptr(), []).append((d, k))
    if not by_storage:
        return 0
    sizes = {ptr: d[k].untyped_storage().nbytes() for ptr, [(d, k), *_] in by_storage.items()}
    starts, total = {}, 0
    for ptr, size in sizes.items():
        starts[ptr] = total
        total += -(-size // ALIGN) * ALIGN
    arena = _mapping(total, give_up=setting == "auto")
    if arena is None:
        return 0
    for ptr, places in by_storage.items():
        _move(places, arena, starts[ptr], sizes[ptr])
    _give_back_freed()
    return total


def _give_back_freed() -> None:
    """glibc's malloc_trim: the old storages' heap pages back to the system (freed, they
    still counted in the process's memory)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _mapping(nbytes: int, give_up: bool) -> torch.Tensor | None:
    """A uint8 tensor of `nbytes` over an anonymous mapping marked MADV_HUGEPAGE before
    any page is touched, starting on a 2 MB boundary (the mapping over-allocated by 2 MB
    to find one), its pages faulted in by `_populate`. The tensor keeps the mapping alive.
    None where (`give_up`: "auto") under a quarter of it came in 2 MB pages: the copy
    (~0.2 s for SmolLM2's 540 MB) would buy little."""
    mapping = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)
    skip = -whole.data_ptr() % HUGE
    if _populate(mapping, skip, nbytes, give_up) < nbytes // 4:  # only when giving up
        return None
    return whole[skip : skip + nbytes]


def _populate(mapping: mmap.mmap, start: int, nbytes: int, give_up: bool) -> int:
    """Faults in the 2 MB pages of mapping[start:start+nbytes] one by one and, with
    `give_up`, at the first that takes longer than SLOW_FAULT_S gives the rest 4 KB
    pages; returns the bytes up to and with that page (all of them without one). A 2 MB
    page the kernel has at hand costs ~0.2 ms (it is zeroed); on a VM whose memory the
    host backs lazily (Firecracker), once those run out each cost ~30-75 ms, and 540 MB
    of them added 4.4 s to loading SmolLM2."""
    for offset in range(start, start + nbytes, HUGE):
        t = time.perf_counter()
        mapping[offset] = 0  # the first write: the kernel backs the page
        if give_up and time.perf_counter() - t > SLOW_FAULT_S:
            rest = offset + HUGE
            if rest < start + nbytes:
                mapping.madvise(mmap.MADV_NOHUGEPAGE, rest, start + nbytes - rest)
            return rest - start
    return nbytes


def _move(places: list, arena: torch.Tensor, start: int, size: int) -> None:
    """Copies the storage the tensors at `places` share to arena[start:start+size] and
    puts in each place a tensor over the copy at the old one's offset, shape and strides."""
    d, k = places[0]
    new = arena[start : start + size]
    new.copy_(torch.empty(0, dtype=torch.uint8).set_(d[k].untyped_storage()))
    storage = new.untyped_storage()
    base = new.data_ptr() - storage.data_ptr()  # the arena's offset in the mapping
    # old tensor's id -> (the old tensor, kept so its id stays unique here; its new one)
    made: dict[int, tuple] = {}
    for d, k in places:
        old = d[k]
        if id(old) not in made:
            offset = base // old.element_size() + old.storage_offset()
            fresh = torch.empty(0, dtype=old.dtype).set_(storage, offset, old.shape, old.stride())
            if isinstance(old, torch.nn.Parameter):
                fresh = torch.nn.Parameter(fresh, requires_grad=False)
            made[id(old)] = (old, fresh)
        d[k] = made[id(old)][1]
