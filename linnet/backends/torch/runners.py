"""How a TorchModel runs its entries: one runner per mode.

- `interpret`: the Core-IR interpreter over the reference decompositions.
- `generated`: the straight-line module from `torch_codegen`, exec'd in-process.
- `compile`: the generated module's entries under `torch.compile` (static cache,
  dynamic shapes so decode positions do not recompile).
- `cudagraphs`: decode captured once and replayed (CUDA only).
A runner has `run(entry, inputs, dims, state)` (an entry's tensor inputs in the
source's order, its runtime dims by name, the model's state: the entry takes the
parts it declares), `inputs` (entry -> [(name, TensorType)]) and `state_types`.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import types
from pathlib import Path

import torch

from linnet.backends.torch import kernels, stream_ahead
from linnet.backends.torch.codegen import (
    class_name,
    generate_graphs,
    lower_entries,
    state_ident,
)
from linnet.backends.torch.huge_pages import hold_in_huge_pages
from linnet.backends.torch.interp import Interpreter
from linnet.backends.torch.outlined import emit_outlined
from linnet.backends.torch.step_fusion import emit_fused
from linnet.errors import LinnetError
from linnet.ir.pipeline import run_pipeline
from linnet.ir.program import Program
from linnet.ir.state_split import split_entry_states

MODES = ("interpret", "generated", "compile", "cudagraphs")
NUMERICS = ("equivalent", "fast")


def reference_graph(program: Program, entry: str):
    """An entry through the `torch.interpret` pipeline: library ops decomposed into
    primitives (numerics=equivalent)."""
    return run_pipeline(program.graphs[entry], "torch.interpret").graph


def entry_inputs(graphs: dict) -> dict:
    """entry -> [(input name, TensorType)] in the source's order."""
    return {e: [(v.name, v.type) for v in g.inputs] for e, g in graphs.items()}


def state_types(graphs: dict) -> dict:
    return {k: v.type for g in graphs.values() for k, v in g.states.items()}


class InterpretedRunner:
    def __init__(self, program: Program, params, device, numerics):
        if numerics != "equivalent":
            raise LinnetError(
                "mode='interpret' runs the reference decompositions: it has only "
                "numerics='equivalent' (use mode='generated' for 'fast')"
            )
        graphs = {e: reference_graph(program, e) for e in program.entries}
        self.runners = {e: Interpreter(g, params, device) for e, g in graphs.items()}
        self.inputs = entry_inputs(graphs)
        self.state_types = state_types(graphs)

    def run(self, entry, inputs, dims, state):
        return self.runners[entry].run(inputs, dims, state)[0]


def load_generated(text: str, name: str):
    """Exec generated source as a module and return its model class."""
    module = types.ModuleType(f"linnet_generated_{name}_{next(_counter)}")
    exec(compile(text, f"<linnet generated {name}>", "exec"), module.__dict__)
    sys.modules[module.__name__] = module  # torch.compile imports what it traces
    return getattr(module, class_name(name))


_counter = itertools.count()


def stack_params(params: dict, fused: dict, column_major=None) -> dict:
    """Each stacked param of `fuse_linears` built once; its parts in `params` become views
    of its rows, so each weight is held once and the source's names still reach it (HF
    exports read them). `column_major(name, like, rows)`: whether to write that one
    column-major (`column_major_linears`' layout, written directly: no second copy).
    Returns the stacked tensors by name."""
    stacked = {}
    for name, parts in fused.items():
        like = params[parts[0]]
        rows = sum(params[p].shape[0] for p in parts)
        plain = all(type(params[p]) is torch.Tensor for p in parts)  # not packed, not MXFP4
        if (
            column_major is not None
            and plain
            and like.dim() == 2
            and column_major(name, like, rows)
        ):
            whole = torch.empty(like.shape[1], rows, dtype=like.dtype, device=like.device).t()
            _view_parts(whole, parts, params, fill=True)
        else:
            whole = torch.cat([params[p] for p in parts])
            _view_parts(whole, parts, params)
        stacked[name] = whole
    return stacked


COLUMN_MAJOR_MIN_ROWS = 8192  # any lm_head
COLUMN_MAJOR_MIN_TALL = 1 << 18  # elements: a layer's taller-than-wide projections (1 MB)


def _column_major_wins(
    like: torch.Tensor, rows: int, cols: int, bf16: bool = True, f32_rows: bool = False
) -> bool:
    """MKL's one-token sgemv on an f32 CPU weight reads a column-major layout faster when
    the weight is taller than wide: an lm_head (12 -> 6 ms for [32000, 512] on the AVX2
    EPYC), a fused qkv or gate/up (0.67-0.77x the time for [640, 512], [960, 576],
    [1536, 576], [3072, 576]); wide or square ones ([576, 1536], [576, 576]) read slower
    that way, and a prompt's GEMM reads either alike (docs/torch.md). A bf16 one reads
    faster so in every shape where the CPU has no bf16 dot product (under the Xeon's
    choices; AMD's keep rows): the kernels' columns
    GEMV streams it once, 14-18% sooner than its rows (`kernels.bf16_columns_preferred`;
    whole 16-row blocks). `bf16=False` (under torch.compile, which never calls the kernels):
    bf16 stays row-major. `f32_rows`: Linnet's f32 GEMV reads the f32 linears (numerics
    "fast" where `kernels.f32_gemv_preferred()`), row by row: f32 stays row-major."""
    if like.device.type != "cpu":
        return False
    if like.dtype == torch.bfloat16:
        return bf16 and rows % 16 == 0 and cols > 1 and kernels.bf16_columns_preferred()
    if like.dtype != torch.float32 or f32_rows:
        return False
    return rows >= COLUMN_MAJOR_MIN_ROWS or (rows > cols and rows * cols >= COLUMN_MAJOR_MIN_TALL)


def column_major_stacks(uses: dict, bf16: bool = True, f32_rows: bool = False):
    """`stack_params`' predicate: a stacked weight only `linear` reads (`uses`, from
    `param_uses`), where it wins (`bf16`, `f32_rows`: see `_column_major_wins`)."""

    def wins(name, like, rows):
        only_linear = uses.get(name) == {("linear", 1)}
        return only_linear and _column_major_wins(like, rows, like.shape[1], bf16, f32_rows)

    return wins


def column_major_linears(
    uses: dict,
    weights: dict,
    params: dict,
    tied: bool = True,
    bf16: bool = True,
    f32_rows: bool = False,
) -> dict:
    """The other f32 (and, where preferred, bf16) CPU weights that `linear` reads and that
    read faster column-major (`_column_major_wins`; stacked ones are written so by
    `stack_params`), re-held with the same shape and values in column-major storage
    (`w.t().contiguous().t()`), in `params` too under every name that shares the weight,
    so each is held once. Besides `linear`
    only a `take` may read it: a tied lm_head's embedding, whose gather of a token's row
    reads it strided (576 floats a token for SmolLM2's, against the 113 MB the head's
    sgemv streams); `tied=False` leaves those (a tensor-parallel rank: the copy of its
    share of the head added that much again to its load's peak). Sums in f32 either way,
    another order; `bf16`, `f32_rows`: see `_column_major_wins`. Returns the replaced
    weights by name."""
    readers = {("linear", 1), ("take", 0)} if tied else {("linear", 1)}
    out = {}
    for name, used in uses.items():
        w = weights.get(name)
        if ("linear", 1) not in used or not used <= readers:
            continue
        if type(w) is not torch.Tensor or w.dim() != 2 or not w.is_contiguous():
            continue
        if not _column_major_wins(w, *w.shape, bf16, f32_rows):
            continue
        moved = w.t().contiguous().t()
        sharing = [n for n, p in params.items() if p is w] or [name]
        out.update({n: moved for n in sharing})
        params.update({n: moved for n in sharing if n in params})
    return out


def generated_weights(
    graphs: dict,
    params: dict,
    fused: dict,
    tied: bool = True,
    bf16: bool = True,
    f32_rows: bool = False,
) -> dict:
    """The params and `fuse_linears`' stacks as the generated module holds them: stacks
    built once, and column-major where that reads faster (`column_major_stacks`,
    `column_major_linears`; `tied`, `bf16`, `f32_rows`: see there). A layer split
    (`linnet/shard/placed.py`) holds the default layout, and so does a whole model under
    numerics="equivalent": each sums its linears in one order."""
    uses = param_uses(graphs.values())  # each param's readers, walked once
    stacks = stack_params(params, fused, column_major_stacks(uses, bf16, f32_rows))
    weights = {**params, **stacks}  # after: params now holds the stacks' parts as views
    weights.update(column_major_linears(uses, weights, params, tied, bf16, f32_rows))
    return weights


def param_uses(graphs) -> dict[str, set]:
    """Each param's readers as (op, input index) pairs, over all the entries' graphs."""
    uses: dict[str, set] = {}
    for graph in graphs:
        names = {id(v): n for n, v in graph.params.items()}
        for node in graph.nodes:
            for i, v in enumerate(node.inputs):
                if id(v) in names:
                    uses.setdefault(names[id(v)], set()).add((node.op, i))
    return uses


def _view_parts(whole: torch.Tensor, parts: list[str], params: dict, fill=False) -> None:
    """Each part in `params` becomes its rows of `whole` (`fill`: copied in first)."""
    lo = 0
    for p in parts:
        rows = params[p].shape[0]
        if fill:
            whole[lo : lo + rows].copy_(params[p])
        params[p] = whole[lo : lo + rows]
        lo += rows


class GeneratedRunner:
    """The generated module; linears that share an input run as one (`fuse_linears`), and
    states split per leading index (`split_states`: the KV cache per layer and k/v), so a
    cache write is one slice of one part; under torch.compile a write into one tensor of
    the whole cache made Inductor copy all of it on every step (47 MB for SmolLM2)."""

    def __init__(
        self, program: Program, params, device, numerics, compiled=False, outlined=None,
        tied_column_major=True,
    ):  # fmt: skip
        graphs, fused = lower_entries(program, fuse=True)
        self.state_types = state_types(graphs)  # what the model holds: whole states
        self.graphs, self.parts = split_entry_states(graphs)
        # outlined (the default when compiled): one method per layer kind, which is what
        # gets compiled, not the whole unrolled entry (`emit_outlined`)
        emitter = emit_outlined if (compiled if outlined is None else outlined) else None
        if emitter is None and numerics == "fast":  # a layer's attention as one call
            emitter = emit_fused
        self.text = generate_graphs(program, self.graphs, numerics, fused, emitter=emitter)
        module = load_generated(self.text, program.name)()
        f32_rows = not compiled and numerics == "fast" and kernels.f32_gemv_preferred()
        weights = generated_weights(
            self.graphs, params, fused, tied_column_major, not compiled, f32_rows
        )
        names = module.state_dict().keys()  # tied params are not attributes of their own
        module.load_state_dict({k: weights[k] for k in names}, assign=True)
        del weights  # its tensors would keep the old storages alive while they move
        self.module = module.to(device).eval()
        # one mapping in 2 MB pages for the weights a step streams (huge_pages.py)
        hold_in_huge_pages(self.module, params)
        self.inputs = entry_inputs(self.graphs)
        self.methods = {e: getattr(self.module, e) for e in self.graphs}
        self._views: dict = {}  # whole state name -> (tensor, {part ident: view})
        # one-token steps on one core, the weights streamed ahead on the other
        self.one_core = (
            not compiled and numerics == "fast" and torch.device(device).type == "cpu"
            and stream_ahead.worth_streaming(self.module)
        )  # fmt: skip
        if compiled:
            use_disk_cache()
            self.methods = compile_entries(self.module, self.methods)

    def state_args(self, graph, state: dict) -> dict:
        """The entry's state arguments: whole states as given, split ones as views of the
        whole (made once per state tensor)."""
        args = {}
        for name in graph.states:
            if name in state:
                args[state_ident(name)] = state[name]
        for whole, parts in self.parts.items():
            if next(iter(parts)) not in graph.states:
                continue  # this entry does not take that state
            tensor = state[whole]
            cached = self._views.get(whole)
            if cached is None or cached[0] is not tensor:
                views = {state_ident(p): tensor[coord] for p, coord in parts.items()}
                self._views[whole] = cached = (tensor, views)
            args.update(cached[1])
        return args

    def run(self, entry, inputs, dims, state):
        graph = self.graphs[entry]
        dim_args = [dims[k] for k in graph.dim_inputs]
        method, states = self.methods[entry], self.state_args(graph, state)
        if self.one_core and stream_ahead.one_token_step(inputs):
            with stream_ahead.one_core_step():
                return method(*inputs, *dim_args, **states)
        return method(*inputs, *dim_args, **states)


def use_disk_cache() -> Path:
    """Inductor's compiled artefacts (its FX graph and AOTAutograd caches, on by default)
    kept under Linnet's cache (`$LINNET_CACHE/inductor/KEY`) unless TORCHINDUCTOR_CACHE_DIR
    says where, so a second process finds them instead of compiling again (torch's own
    default is under /tmp). KEY is the C++ kernel library's build key: inductor's cache
    key does not cover what a custom op returns, so a graph traced against one build of
    the kernels is never replayed against another. Importing torch._dynamo sets
    TORCHINDUCTOR_CACHE_DIR to torch's default: that value is not a user's choice. (It
    was taken for one: a graph compiled under another build of the kernels was replayed
    from /tmp and aborted the process, docs/torch.md, "Compile once per layer shape".)"""
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or _torch_default_cache_dir(chosen):
        env = os.environ.get("LINNET_CACHE")
        root = Path(env).expanduser() if env else Path.home() / ".cache" / "linnet"
        key = kernels.build_dir().name
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor" / key)
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def _torch_default_cache_dir(path: str) -> bool:
    """Whether `path` is the directory torch's own `cache_dir()` writes into the
    environment when nothing was set."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another torch: treat every setting as the user's
        return False
    return os.path.abspath(path) == os.path.abspath(default_cache_dir())


def compile_entries(module, methods: dict) -> dict:
    """Compiled methods in place of `methods` (entry -> bound method): an outlined entry
    keeps its eager method and each of its layer methods (`_<entry>_layer<k>`) is compiled
    alone, so compile time does not grow with depth; an entry without layers is compiled
    whole. Dynamic shapes: one graph for every decode position and prompt length."""
    compiled = {}
    for entry, method in methods.items():
        layers = [n for n in vars(type(module)) if re.fullmatch(rf"_{entry}_layer\d+", n)]
        for name in layers:  # the function, not a bound method: dynamo keys its cache on
            # the code object, and bound methods share one wrapper's
            compiled_fn = torch.compile(getattr(type(module), name), dynamic=True)
            setattr(module, name, types.MethodType(compiled_fn, module))
        compiled[entry] = method if layers else torch.compile(method, dynamic=True)
    return compiled


def make_runner(mode: str, program: Program, params, device, numerics, whole=True):
    """`whole=False`: a tensor-parallel rank's share (see `column_major_linears`)."""
    if mode not in MODES:
        raise LinnetError(f"mode={mode!r}: choose one of {', '.join(MODES)}")
    if numerics not in NUMERICS:
        raise LinnetError(f"numerics={numerics!r}: choose one of {', '.join(NUMERICS)}")
    if mode == "cudagraphs":
        from linnet.backends.torch.cudagraphs import CudaGraphRunner

        return CudaGraphRunner(program, params, device, numerics)
    if mode == "interpret":
        return InterpretedRunner(program, params, device, numerics)
    compiled = mode == "compile"
    return GeneratedRunner(program, params, device, numerics, compiled, tied_column_major=whole)
