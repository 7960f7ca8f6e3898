"""Linnet's own C++ kernels (issue 21), built on first use and cached.

    ops = kernels.load()        # torch.ops.linnet_kernels, or None: use the PyTorch path
    ops.packed_linear(x, codes, scale, offset)   # packed_gemv.cpp
    int8x_linear_op()           # packed_vnni.cpp's op (x rounded to int8) where this CPU has
                                # AVX512-VNNI or AVX2 (packed_int8_avx2.cpp), or None
    bf16_linear_op(x, w)        # bf16_gemv.cpp's op (AVX512-BF16's dot products, or AVX2's
                                # widening FMAs), bf16_columns.cpp's for a column-major w,
                                # or None
    f32_linear_op(x, w)         # f32_gemv.cpp's op where cpu_tuning.h takes AMD's choices,
                                # or None (torch's linear); f32_decode_linear(x, w, b) runs it
    force_amd_tuning(mode)      # cpu_tuning.h's choices forced on (1), off (0), by CPU (-1)
    set_page_ahead(nbytes)      # page_ahead.h's distance (0: off), for benchmarks
    ops.stream_ahead(nbytes)    # stream_ahead.cpp's helper thread: how far it reads ahead;
                                # ops.stream_ahead_step(on) for this thread's decode steps
                                # (linnet/backends/torch/stream_ahead.py decides when)
    bf16_columns_preferred()    # hold bf16 linears column-major (no bf16 dot product here)
    step_ops()                  # load(), for the per-call helpers of a decode step
                                # (decode_ops.cpp: rms_norm, rope, decode_attention,
                                # decode_attention_rows: one position per cache row,
                                # attend_cached: a layer's attention from its qkv)

The sources here are compiled with the machine's own instructions (`-O3 -march=native`)
with the C++ compiler against torch's headers into `$LINNET_CACHE/kernels/KEY` (default
`~/.cache/linnet`), KEY hashing the sources, the flags, torch's version and the CPU's
feature flags, so a second process loads the library without compiling and another CPU
never loads code built for this one. `load()` answers None, and callers keep their pure
PyTorch path, when `LINNET_KERNELS=0`, when the CPU lacks AVX2 (x86 only), or when the
build fails (no compiler, say: one warning line, never an exception).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import os
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

SOURCES = (
    "packed_gemv.cpp",
    "bf16_gemv.cpp",
    "f32_gemv.cpp",
    "bf16_columns.cpp",
    "packed_vnni.cpp",
    "packed_int8_avx2.cpp",
    "mxfp4_gemv.cpp",
    "mxfp4_int8.cpp",
    "decode_ops.cpp",
    "stream_ahead.cpp",
)
HEADERS = (
    "cpu_tuning.h",
    "page_ahead.h",
    "stream_ahead.h",
)  # included by the sources: part of the build's key
FLAGS = ("-O3", "-march=native")
OFF_VALUES = ("0", "off", "false", "no")  # what turns an environment switch off
_loaded: dict[str, object] = {}  # "ops": the op namespace, or None once refused
_KEY = "LINNET_KERNELS"
# os.environ's own bytes-keyed store (POSIX CPython: what setenv and monkeypatch write
# through): the packed linears look the switches up on every call, and os.environ.get
# costs ~1 us where this costs ~0.1 (121 calls a SmolLM2 step)
_RAW_ENV = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _switches() -> tuple:
    """LINNET_KERNELS and LINNET_INT8X as set now (raw values: only compared)."""
    if _RAW_ENV is not None:
        return _RAW_ENV.get(b"LINNET_KERNELS"), _RAW_ENV.get(b"LINNET_INT8X")
    return os.environ.get(_KEY), os.environ.get("LINNET_INT8X")


def enabled() -> bool:
    """False when LINNET_KERNELS is 0/off/false/no: the PyTorch fallback everywhere."""
    return os.environ.get("LINNET_KERNELS", "1").strip().lower() not in OFF_VALUES


def cpu_supported() -> bool:
    """The kernels are written for x86 vector units: AVX2 with FMA at least."""
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def load():
    """The kernels' op namespace, built or loaded once per process; None where they
    cannot run here (see the module docstring). Checks LINNET_KERNELS on every call."""
    if not enabled() or not cpu_supported():
        return None
    if "ops" not in _loaded:
        _loaded["ops"] = _build_or_load()
    return _loaded["ops"]


def bf16_linear_op(x: torch.Tensor, w: torch.Tensor):
    """`op(x2, w, b)` for a CPU bf16 x and a bf16 weight, where the kernels load: for a
    contiguous w whose rows are whole 32-element blocks, bf16_gemv.cpp's (built with
    AVX512-BF16 or AVX2+FMA); for a column-major one (w^T contiguous) of whole 16-row
    blocks, bf16_columns.cpp's (AVX2+FMA). Asked for every bf16 decode linear (121 a
    SmolLM2 step): cheap checks, and `load()`'s answer kept until LINNET_KERNELS changes
    (`step_ops`): 9.3 -> 2.3 us."""
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or not x.is_cpu or w.dim() != 2:
        return None
    if w.is_contiguous():
        return step_ops().bf16_linear if not w.shape[1] % 32 and bf16_gemv_available() else None
    if w.stride() == (1, w.shape[0]) and not w.shape[0] % 16 and w.shape[1] > 1:
        return step_ops().bf16_linear_columns if _built_answer("bf16_columns_native") else None
    return None


_PLAIN = (torch.Tensor, torch.nn.Parameter)
F32_GEMV_ROWS = 4  # f32_gemv.cpp for decode's rows (each x row stays in L1); GEMM past them


def f32_linear_op(x: torch.Tensor, w: torch.Tensor):
    """`op(x2, w, b)` (f32_gemv.cpp) for a CPU f32 x and a contiguous f32 weight of whole
    16-element rows, where the kernels load, were built with AVX512F and the CPU takes
    cpu_tuning.h's AMD choices (there torch's f32 GEMV read at 12 GB/s, this one at 20);
    else None. Asked for every f32 decode linear (numerics="fast"): cheap checks first."""
    if x.dtype != torch.float32 or w.dtype != torch.float32 or not x.is_cpu or w.dim() != 2:
        return None
    if type(w) not in _PLAIN:  # a packed weight's storage is not its f32 values
        return None
    if w.shape[1] % 16 or not w.is_contiguous() or not f32_gemv_preferred():
        return None
    return step_ops().f32_linear


def f32_decode_linear(x: torch.Tensor, w: torch.Tensor, b=None):
    """x @ w^T + b by f32_gemv.cpp for at most `F32_GEMV_ROWS` rows of f32 x where
    `f32_linear_op` offers it, outside autograd and torch.compile; else None (the caller
    keeps torch's linear)."""
    rows = x.numel() // x.shape[-1]
    if rows > F32_GEMV_ROWS or x.requires_grad or w.requires_grad:
        return None
    op = None if torch.compiler.is_compiling() else f32_linear_op(x, w)
    if op is None:
        return None
    return op(x.reshape(rows, -1).contiguous(), w, b).reshape(*x.shape[:-1], -1)


def f32_gemv_preferred() -> bool:
    """Whether decode's f32 linears go to f32_gemv.cpp here (`f32_linear_op` offers it for
    row-major weights, so the runners hold f32 row-major under numerics="fast")."""
    return _amd_tuned() and _built_answer("f32_gemv_native")


def _amd_tuned() -> bool:
    """cpu_tuning.h's answer (the CPU's vendor, or what `force_amd_tuning` set), kept
    until LINNET_KERNELS changes or it is forced again."""
    raw = _switches()[0]
    seen = _loaded.get("amd")
    if seen is None or seen[0] != raw:
        ops = step_ops()
        seen = _loaded["amd"] = (raw, ops is not None and bool(ops.amd_tuned()))
    return seen[1]


def force_amd_tuning(mode: int) -> int:
    """Force cpu_tuning.h's AMD choices for this process: 1 on, 0 off, -1 by the CPU's
    vendor (tests and benchmarks run both kernels of a pair on one machine); answers the
    mode before. Raises where the kernels do not load."""
    ops = step_ops()
    if ops is None:
        raise RuntimeError("linnet's C++ kernels are not loaded here")
    before = int(ops.amd_tuning(mode))
    _loaded.pop("amd", None)
    return before


def set_page_ahead(nbytes: int) -> int:
    """Set how far ahead (bytes, whole 4 KB pages; 0: off) the row kernels touch the
    weights' pages (page_ahead.h) for this process; answers the distance before (the op
    itself, `page_ahead`, is what bench/packed_decode.py calls between variants). Raises
    where the kernels do not load."""
    ops = load()
    if ops is None:
        raise RuntimeError("linnet's C++ kernels are not loaded here")
    return int(ops.page_ahead(nbytes))


def bf16_columns_preferred() -> bool:
    """Whether bf16 decode linears read faster held column-major here: bf16_columns.cpp
    runs and this CPU has no bf16 dot product (the kernels were built without
    AVX512-BF16), so the row-major alternative is the same widening FMAs in a worse
    order on the Xeon (docs/torch.md, "Session 19"); not under AMD's choices, where the
    AVX2 row tiles read SmolLM2's bf16 linears at 13.2 GB/s and the columns at 8.8-11.0
    (the Zen 4 EPYC running its AVX2 code: "Session 23")."""
    return _built_answer("bf16_columns_preferred") and not _amd_tuned()


def bf16_gemv_available() -> bool:
    """Whether bf16_gemv.cpp's op runs here (the kernels load, built with AVX512-BF16 or
    AVX2+FMA)."""
    return _built_answer("bf16_gemv_native")


def _built_answer(op: str) -> bool:
    """What the kernels' no-argument op `op` says about their build (False where they do
    not load), asked once per process."""
    ops = step_ops()
    if ops is None:
        return False
    if op not in _loaded:
        _loaded[op] = bool(getattr(ops, op)())
    return _loaded[op]


def int8x_linear_op():
    """`packed_linear_int8x(x2, codes, scale, offset)`: x quantized per 32-block to int8 and
    integer dot products (numerics="fast" only), where the kernels load and were built with
    AVX512-VNNI or AVX2; else None (also when LINNET_INT8X is 0/off/false/no: the f32
    kernel). Called for each packed linear (~120 a decode step): the answer is kept until
    LINNET_KERNELS or LINNET_INT8X changes (`load()`'s checks cost ~2 µs a call); not
    while torch.compile traces (dynamo failed on the cached tuple holding the op)."""
    if torch.compiler.is_compiling():
        return _int8x_op()
    raw = _switches()
    seen = _loaded.get("int8x_op")
    if seen is None or seen[0] != raw:
        seen = _loaded["int8x_op"] = (raw, _int8x_op())
    return seen[1]


def _int8x_op():
    ops = load()
    if ops is None or os.environ.get("LINNET_INT8X", "1").strip().lower() in OFF_VALUES:
        return None
    if "int8x" not in _loaded:
        _loaded["int8x"] = bool(ops.int8x_native())
    return ops.packed_linear_int8x if _loaded["int8x"] else None


def int8x_derived_offsets() -> bool:
    """Whether the integer op takes q4_0 and q5_0 codes without their offsets (-8 and -16
    times the scale): the AVX2 kernel derives them (q4_0: 20 bytes read a block, not 24)
    and reads q5_0; the VNNI kernel reads stored offsets and no q5_0. False where the
    kernels do not load."""
    if "derived" not in _loaded:
        ops = load()
        if ops is None:
            return False
        _loaded["derived"] = bool(ops.int8x_derived_offsets())
    return _loaded["derived"]


def int8x_reads_q5_0() -> bool:
    """Whether a q5_0 weight stays 5-bit here (`linnet.quantize.to_packed_weight`): the
    kernels load and their integer op reads it faster so (the f32 kernel and the PyTorch
    path read q5_0 everywhere): not on a VNNI CPU under AMD's choices (packed_vnni.cpp's
    `reads_q5_0`, cpu_tuning.h). Elsewhere it takes q8_0's layout, which every kernel
    reads. Asked at load, not cached: `force_amd_tuning` changes it."""
    ops = load()
    return ops is not None and bool(ops.int8x_reads_q5_0())


def step_ops():
    """`load()` for helpers called ~150 times a decode step (decode_ops.cpp's norm, rope
    and attention): the same answer, `load()`'s checks (the CPU's capability among them)
    redone only when LINNET_KERNELS changed."""
    raw = _switches()[0]
    seen = _loaded.get("step")
    if seen is None or seen[0] != raw:
        seen = _loaded["step"] = (raw, load())
    return seen[1]


def _register_fakes() -> None:
    """Shapes for torch.compile's tracing (the ops run eagerly between graphs)."""

    @torch.library.register_fake("linnet_kernels::packed_linear")
    def _(x, codes, scale, offset):
        return x.new_empty(*x.shape[:-1], scale.shape[0])

    @torch.library.register_fake("linnet_kernels::packed_linear_int8x")
    def _(x, codes, scale, offset):
        return x.new_empty(*x.shape[:-1], scale.shape[0])

    @torch.library.register_fake("linnet_kernels::bf16_linear")
    def _(x, w, b):
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("linnet_kernels::f32_linear")
    def _(x, w, b):
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("linnet_kernels::bf16_linear_columns")
    def _(x, w, b):
        return x.new_empty(x.shape[0], w.shape[0])

    @torch.library.register_fake("linnet_kernels::rms_norm")
    def _(x, w, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @torch.library.register_fake("linnet_kernels::rope")
    def _(x, cos, sin, offset):
        return x.new_empty(x.shape)

    @torch.library.register_fake("linnet_kernels::decode_attention")
    def _(q, k, v, scale, start, sinks):
        return q.new_empty(q.shape)

    @torch.library.register_fake("linnet_kernels::attend_cached")
    def _(y, q_lo, k_lo, v_lo, heads, cos, sin, at, k_cache, v_cache, scale, start, sinks, *norms):
        return y.new_empty(y.shape[0], 1, heads * k_cache.shape[3])


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return torch.backends.cpu.get_cpu_capability()


def build_dir() -> Path:
    here = Path(__file__).parent
    key = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        key.update((here / source).read_bytes())
    key.update(" ".join((*FLAGS, torch.__version__, _cpu_flags())).encode())
    env = os.environ.get("LINNET_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "linnet"
    return root / "kernels" / key.hexdigest()[:16]


def _build_or_load():
    try:
        out = build_dir()
        library = out / "linnet_kernels.so"
        if not library.is_file():
            with _build_lock(out):  # another process building it: wait, then load its library
                if not library.is_file():
                    _build(out)
        torch.ops.load_library(str(library))
        _register_fakes()
        return torch.ops.linnet_kernels
    except Exception as e:  # a missing compiler or ninja, a failed build: PyTorch path
        reason = " ".join(str(e).split())[:200]
        warnings.warn(f"linnet: C++ kernels not built ({reason}); using PyTorch", stacklevel=3)
        return None


@contextlib.contextmanager
def _build_lock(out: Path):
    """An exclusive fcntl lock on OUT/build.lock: two processes (pytest's workers, say)
    wanting the same library build it once; the kernel drops the lock if the builder dies."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compile_all(commands: list[list[str]]) -> None:
    """Run the compile commands at once, at most one per core; the first failure raises."""
    width = max(1, min(len(commands), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(width) as pool:
        runs = pool.map(lambda c: subprocess.run(c, capture_output=True, text=True), commands)
        for command, done in zip(commands, list(runs)):
            if done.returncode != 0:
                raise RuntimeError(f"{command[0]} failed: {done.stderr.strip()[-300:]}")


def _build(out: Path) -> Path:
    """Compile each source to an object file in parallel (one `-c` per source), then link
    them against torch's libraries with the C++ compiler (CXX, default c++); everything is
    written under temporary names and the library renamed into place, so a concurrent
    process never loads half a library."""
    torch_dir = Path(torch.__file__).parent
    here = Path(__file__).parent
    cxx = os.environ.get("CXX", "c++")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix="build.") as work:
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        compile_flags = [
            "-fPIC", "-std=c++20", *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-isystem", str(torch_dir / "include"),
        ]  # fmt: skip
        objects = [str(Path(work) / f"{Path(s).stem}.o") for s in SOURCES]
        _compile_all(
            [[cxx, *compile_flags, "-c", str(here / s), "-o", o] for s, o in zip(SOURCES, objects)]
        )
        tmp = Path(work) / "linnet_kernels.so"
        link = [cxx, "-shared", *FLAGS, *objects, f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu"]
        _compile_all([[*link, "-o", str(tmp)]])
        library = out / "linnet_kernels.so"
        tmp.replace(library)
    return library
