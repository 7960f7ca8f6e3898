"""A checked `.linnet` source and what it yields for one config.

src = Source.load("zoo/llama.linnet")        # parse + check, or SourceError
cfg = src.config({"dim": 64, "n_layers": 2})  # defaults, overrides, constraints
src.params(cfg)                               # {"layers.0.wq": TensorType, ...}
src.lower(cfg, "decode")                      # Core-IR graph of one entry
src.program(cfg)                              # every entry lowered: what backends take
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from linnet.check.config import ParamLimitError, resolve_config
from linnet.check.elaborate import Elaborator, absent_entry_message, check_source
from linnet.check.values import BlockInfo, Frame
from linnet.core.diagnostics import DiagnosticError
from linnet.core.dims import Poly
from linnet.errors import CheckpointError, LinnetError, SourceError
from linnet.ir.graph import Graph
from linnet.ir.program import Program
from linnet.ir.types import TensorType
from linnet.syntax import ast as A
from linnet.syntax.parser import parse


@dataclass
class ParamLayout:
    """The params one config has: shapes of those present, and aliases (tied)."""

    shapes: dict[str, TensorType]
    tied: dict[str, str]  # param -> the param it shares


def display_path(path: Path) -> str:
    """How diagnostics and guards name a source: zoo sources as `zoo/NAME.linnet` wherever
    Linnet is installed (so messages and generated code do not depend on the checkout)."""
    from linnet.zoo import HERE as ZOO

    try:
        return str(Path("zoo") / path.resolve().relative_to(ZOO))
    except ValueError:
        return str(path)


class Source:
    def __init__(self, module: A.Module) -> None:
        self.module = module

    @classmethod
    def parse_text(cls, text: str, path: str = "<source>") -> Source:
        try:
            module = parse(text, path)
        except DiagnosticError as err:
            raise SourceError([err.diagnostic]) from None
        diagnostics = check_source(module)
        if diagnostics:
            raise SourceError(diagnostics)
        return cls(module)

    @classmethod
    def load(cls, path: str | Path) -> Source:
        path = Path(path)
        return cls.parse_text(path.read_text(encoding="utf-8"), display_path(path))

    @property
    def name(self) -> str:
        return self.module.name

    @property
    def fields(self) -> list[str]:
        """The config's field names."""
        return [f.name for f in self.module.fields]

    @property
    def entries(self) -> list[str]:
        return list(dict.fromkeys(f.name for f in self.module.fns if f.kind == "entry"))

    def entry_inputs(self, name: str) -> list[str]:
        """The argument names of entry `name` (its first declaration); none if it has none."""
        fn = next((f for f in self.module.fns if f.kind == "entry" and f.name == name), None)
        return [a.name for a in fn.args] if fn else []

    def entries_for(self, config: dict) -> list[str]:
        """The entries this config has: those declared `entry ... if COND` need COND true
        (the others lower to a graph that fails at run time, saying why)."""
        elab = Elaborator(self.module, config)
        names = [f.name for f in self.module.fns if f.kind == "entry" and elab.entry_exists(f)]
        return list(dict.fromkeys(names))

    def absent_entry(self, name: str) -> str:
        """Why a config without entry `name` lacks it (its first declaration's `if`)."""
        fn = next(f for f in self.module.fns if f.kind == "entry" and f.name == name)
        return absent_entry_message(self.module, fn)

    def config(self, overrides: dict | None = None, origins: dict | None = None) -> dict:
        """Concrete config values; `origins` names where an override came from
        (`dim` -> "config.json: hidden_size") so that errors point there."""
        return resolve_config(self.module, overrides, origins)

    def params(self, config: dict, max_params: int | None = None) -> ParamLayout:
        """The param layout for `config`. `max_params` stops a config whose block counts
        ask for more params than can exist (a ParamLimitError naming the block)."""
        try:
            elab = Elaborator(self.module, config)
        except DiagnosticError as err:
            raise SourceError([err.diagnostic]) from None
        layout = ParamLayout({}, {})
        self._collect(elab, elab.param_tree, "", layout, max_params)
        return layout

    def _collect(self, elab, tree: dict, prefix: str, layout: ParamLayout, limit) -> None:
        for name, node in tree.items():
            if isinstance(node, BlockInfo):
                for i in range(node.count.value):
                    members = node.members_at(Poly.const(i))
                    self._collect(elab, members, f"{prefix}{name}.{i}.", layout, limit)
                    if limit is not None and len(layout.shapes) > limit:
                        raise ParamLimitError(self.module.path, prefix + name, node, limit)
                continue
            own = getattr(node, "frame", None) or Frame(None)  # binds a block's `as` index
            cond = True if node.cond is None else elab.expr(node.cond, own).value
            if node.alias is not None and cond:
                layout.tied[prefix + name] = prefix + node.alias.id
            elif cond or node.alias is not None:  # an untied alias is a param of its own
                layout.shapes[prefix + name] = node.resolved

    def check_weights(self, config: dict, weights: dict, where: str = "") -> ParamLayout:
        """The layout for `config`, after checking that `weights` (any arrays with a
        `.shape`) hold exactly its params with their shapes (tied params may be left out)."""
        layout = self.params(config)
        where = where or self.module.path
        missing = sorted(set(layout.shapes) - set(weights))
        extra = sorted(set(weights) - set(layout.shapes) - set(layout.tied))
        if missing or extra:
            raise CheckpointError(
                f"weights do not fit {where}: missing {missing[:5]}, unexpected {extra[:5]}",
                tensor=(missing or extra)[0],
            )
        for name, t in layout.shapes.items():
            want = tuple(d.value for d in t.shape)
            if tuple(weights[name].shape) != want:
                raise CheckpointError(
                    f"param `{name}` must have shape {want}, got {tuple(weights[name].shape)}",
                    tensor=name,
                )
        return layout

    def lower(self, config: dict, entry: str) -> Graph:
        try:
            return Elaborator(self.module, config).lower_entry(entry)
        except DiagnosticError as err:  # a mistake only this config exposes
            raise SourceError([err.diagnostic]) from None

    def program(self, config: dict, entries=None) -> Program:
        """Every entry (or those of `entries`) lowered for `config`, with the param layout:
        what a backend takes."""
        unknown = set(entries or ()) - set(self.entries)
        if unknown:
            raise LinnetError(f"the {self.name} source has no entry {', '.join(sorted(unknown))}")
        wanted = [e for e in self.entries if entries is None or e in entries]
        graphs = {entry: self.lower(config, entry) for entry in wanted}
        layout = self.params(config)
        return Program(self.name, config, graphs, layout.shapes, layout.tied)
