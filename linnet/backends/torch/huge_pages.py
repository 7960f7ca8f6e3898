"""A CPU model's weights in transparent huge pages (Linux).

A decode step streams every weight once (SmolLM2-135M: 540 MB in f32), and with 4 KB
pages each 4 KB of it is a TLB entry: hundreds of thousands of page walks a step. Where
the kernel's THP setting is `madvise` (the common default: `always` is rare), torch's
allocations get 4 KB pages unless torch was started with THP_MEM_ALLOC_ENABLE=1.
`hold_in_huge_pages` copies the bytes the weights read of their storages into one
anonymous mapping marked MADV_HUGEPAGE, aligned to 2 MB, and points every tensor that
shared a storage at its copy (views stay views, a tied weight stays one), so the old
storages are freed. On sessions 16-21's AVX-512 Xeon SmolLM2's decode step took 0-16%
less time with every weight in 2 MB pages (bf16 14%, q8_0 16%, f32 3%, q4_0 none:
docs/torch.md, "Session 21"). Values and layouts do not change: only where the bytes lie.

Storages move one at a time, each one's 2 MB pages faulted in just before its copy
(`_Arena.fault_in`), so loading peaks at the weights plus the largest storage. Where a
2 MB page is slow to come (a VM whose memory the host backs lazily), the storages from
there on stay in torch's allocations (4 KB pages), so loading does not wait seconds for
them. LINNET_HUGE_PAGES=always takes them however slow (a server that loads once),
LINNET_HUGE_PAGES=0 keeps torch's allocations (an A/B); elsewhere than Linux nothing
moves.
"""

from __future__ import annotations

import contextlib
import contextvars
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
TRIM_BYTES = 16 << 20  # freed this much, hand it back (a trim costs ~0.2 ms)
SLOW_FAULT_S = 0.004  # a 2 MB page fault this slow: the kernel has none at hand
_now = time.perf_counter  # how faults are timed (a test makes one slow)


# what an unset LINNET_HUGE_PAGES means here: `linnet serve` loads once and decodes for
# hours, so it waits for every 2 MB page (`every_page`)
_unset = contextvars.ContextVar("linnet_huge_pages_unset", default="auto")


@contextlib.contextmanager
def every_page():
    """Within the block an unset LINNET_HUGE_PAGES means "always"."""
    token = _unset.set("always")
    try:
        yield
    finally:
        _unset.reset(token)


def mode() -> str:
    """ "off" (LINNET_HUGE_PAGES=0, or no madvise here: not Linux), "always" (every 2 MB
    page however long its fault takes) or "auto" (the default outside `every_page`: until
    one is slow)."""
    value = os.environ.get("LINNET_HUGE_PAGES", _unset.get()).strip().lower()
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

    One storage at a time, only the bytes its tensors read (`_span`): its pages faulted
    in, the copy made, every place pointed at it, the old storage freed and handed back,
    so a load's memory peaks at the weights plus the largest storage, not twice the
    weights (a tensor-parallel rank of SmolLM2 holding 171 MiB grew 457 MB by its load
    when the whole mapping was faulted in first and its embedding slice moved the whole
    table it was a view of).
    Each slot gets a new tensor over the copy (one per old tensor object, so two slots
    that held one object still do): setting the old tensor on the new storage in place
    would keep a view's base, and with it the old storage, alive."""
    setting = mode()
    if setting == "off":
        return 0
    by_storage: dict[int, list[tuple[dict, str]]] = {}
    for d, k in slots(module, params):
        t = d[k]
        if t.device.type == "cpu" and not t.requires_grad and t.numel():
            by_storage.setdefault(t.untyped_storage().data_ptr(), []).append((d, k))
    spans = {ptr: _span([d[k] for d, k in places]) for ptr, places in by_storage.items()}
    spans = {ptr: (lo, hi) for ptr, (lo, hi) in spans.items() if hi - lo >= MIN_BYTES}
    if not spans:
        return 0
    starts, total = {}, 0
    for ptr, (lo, hi) in spans.items():
        starts[ptr] = total
        total += -(-(hi - lo) // ALIGN) * ALIGN
    arena = _Arena(total, give_up=setting == "auto")
    moved = untrimmed = 0
    for ptr, (lo, hi) in spans.items():
        if not arena.fault_in(starts[ptr], hi - lo):
            break  # a slow 2 MB page: this storage and the rest stay where they are
        _move(by_storage[ptr], arena.bytes[starts[ptr] : starts[ptr] + hi - lo], lo)
        moved, untrimmed = moved + hi - lo, untrimmed + hi - lo
        if untrimmed >= TRIM_BYTES:
            _give_back_freed()
            untrimmed = 0
    _give_back_freed()
    return moved


def _give_back_freed() -> None:
    """glibc's malloc_trim: the old storages' heap pages back to the system (freed, they
    still counted in the process's memory)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class _Arena:
    """An anonymous mapping of `nbytes` marked MADV_HUGEPAGE before any page is touched,
    `bytes` a uint8 tensor over it from a 2 MB boundary (the mapping over-allocated by
    2 MB to find one; the tensor keeps the mapping alive). Its 2 MB pages are faulted in
    one by one as storages move in (`fault_in`)."""

    def __init__(self, nbytes: int, give_up: bool):
        self.mapping = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.mapping.madvise(mmap.MADV_HUGEPAGE)
        whole = torch.frombuffer(self.mapping, dtype=torch.uint8)
        self.skip = -whole.data_ptr() % HUGE
        self.bytes = whole[self.skip : self.skip + nbytes]
        self.give_up = give_up
        self.faulted = 0  # bytes from `skip` whose pages are in

    def fault_in(self, start: int, size: int) -> bool:
        """Faults in the 2 MB pages under bytes[start:start+size] not yet in. With
        `give_up`, at the first that takes longer than SLOW_FAULT_S it hands back the
        pages this call faulted, marks the rest of the mapping MADV_NOHUGEPAGE and
        answers False: nothing more moves. A 2 MB page the kernel has at hand costs
        ~0.2 ms (it is zeroed); on a VM whose memory the host backs lazily (Firecracker),
        once those run out each cost ~30-75 ms, and 540 MB of them added 4.4 s to
        loading SmolLM2."""
        first = self.faulted
        for offset in range(first, start + size, HUGE):
            t = _now()
            self.mapping[self.skip + offset] = 0  # the first write: the kernel backs the page
            if self.give_up and _now() - t > SLOW_FAULT_S:
                rest = len(self.mapping) - self.skip - first
                self.mapping.madvise(mmap.MADV_DONTNEED, self.skip + first, rest)
                self.mapping.madvise(mmap.MADV_NOHUGEPAGE, self.skip + first, rest)
                return False
            self.faulted = offset + HUGE
        return True


def _span(tensors: list) -> tuple[int, int]:
    """The bytes of their storage that `tensors` read: from the first one's first byte,
    rounded down to ALIGN (so every dtype's offset stays whole and each tensor lies at its
    old offset's alignment), to the last one's last. A rank's slice of a tensor read from the
    checkpoint is a view of the whole one: SmolLM2's embedding over 3 ranks reads 36 of
    its storage's 108 MiB."""
    lo, hi = None, 0
    for t in tensors:
        first = t.storage_offset() * t.element_size()
        reach = 1 + sum((n - 1) * step for n, step in zip(t.shape, t.stride()))  # elements
        last = first + reach * t.element_size()
        lo, hi = (first if lo is None else min(lo, first)), max(hi, last)
    return lo // ALIGN * ALIGN, hi


def _move(places: list, new: torch.Tensor, lo: int) -> None:
    """Copies the bytes from `lo` of the storage the tensors at `places` share into `new`
    (uint8, a piece of the arena) and puts in each place a tensor over the copy at the
    old one's offset less `lo`, shape and strides."""
    d, k = places[0]
    old_bytes = torch.empty(0, dtype=torch.uint8).set_(d[k].untyped_storage())
    new.copy_(old_bytes[lo : lo + new.numel()])
    del old_bytes
    storage = new.untyped_storage()
    base = new.data_ptr() - storage.data_ptr() - lo  # where the old storage's byte 0 maps
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
