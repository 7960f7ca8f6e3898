"""The zoo registry: entries.toml (what each model is) and revisions.toml (its pinned commit).

    from linnet.zoo import registry
    entry = registry().get("smollm2-135m-instruct")
    entry.repo, entry.revision, entry.tolerance("torch", "bf16")

A ready entry runs on a zoo source through the weights map of its architecture; a planned
entry is only listed. Nothing here imports torch or huggingface_hub.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from linnet.errors import LinnetError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
ENTRIES_FILE = HERE / "entries.toml"
REVISIONS_FILE = HERE / "revisions.toml"
COMMIT_RE = re.compile(r"[0-9a-f]{40}")

#: Config fields that identify a model's shape: a local folder whose config.json agrees on
#: all of those an entry states is recognised as that entry.
SHAPE_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "tie_word_embeddings",
    "n_embd", "n_layer", "n_head", "n_positions",
    "image_size", "patch_size", "hidden_sizes", "depths", "layer_type",
    "num_mel_bins", "d_model", "encoder_layers", "decoder_layers",
    "block_out_channels", "latent_channels", "layers_per_block",
)  # fmt: skip
#: Nested configs (SigLIP's towers) whose SHAPE_FIELDS identify the model too.
NESTED_CONFIGS = ("text_config", "vision_config")


class UnknownEntry(LinnetError):
    """A name that is neither a zoo entry nor an alias."""


@dataclass(frozen=True)
class Tolerance:
    """Limits against the reference, for one backend and dtype: on the last-position logits
    (decoders: top-5), on the pooled sentence embeddings and hidden states (encoders:
    cosine), or on every output of an image model (vision: max |Δ| and rel only)."""

    max_abs: float  # max |Δ|
    rel: float  # ‖Δ‖₂ / ‖ref‖₂
    top5: int = 0  # least overlap of the two top-5 sets (decoders)
    cosine: float = 0.0  # least cosine similarity of the two embeddings (encoders)

    def as_dict(self) -> dict:
        """The limits that apply (parity records): top5 for logits, cosine for embeddings."""
        last = {"cosine": self.cosine} if self.cosine else {"top5": self.top5} if self.top5 else {}
        return {"max_abs": self.max_abs, "rel": self.rel, **last}

    def text(self) -> str:
        out = f"max|Δ| ≤ {self.max_abs:g}, rel ≤ {self.rel:g}"
        if self.cosine:
            return f"{out}, cosine ≥ {self.cosine:g}"
        return f"{out}, top-5 ≥ {self.top5}/5" if self.top5 else out


@dataclass(frozen=True)
class Entry:
    name: str
    repo: str
    architecture: str
    license: str
    status: str = "ready"  # or "planned"
    revision: str | None = None  # a full commit hash, or None: unpinned
    aliases: tuple[str, ...] = ()
    reference: str = ""
    params: str = ""
    chat: bool = True
    prompts: tuple[str, ...] = ()
    backends: tuple[str, ...] = ()
    tolerances: dict[str, dict[str, Tolerance]] = field(default_factory=dict)
    own_tolerances: bool = False  # False: inherited from [defaults.tolerances]
    #: [defaults.tiny.tolerances]: parity CI's tiny random checkpoints, where they apply
    tiny_tolerances: dict[str, dict[str, Tolerance]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    needs: str = ""  # planned entries: what the compiler still lacks
    kind: str = "decoder"  # "encoder": sentences, parity on embeddings; "vision": on images
    subfolder: str | None = None  # the repo folder that is the checkpoint (a pipeline's "unet")

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def pinned(self) -> bool:
        return self.revision is not None

    @property
    def reference_class(self) -> str:
        """The transformers class name alone ("LlamaForCausalLM")."""
        return self.reference.rpartition(".")[2]

    def tolerance(self, backend: str, dtype: str, weights: str = "real") -> Tolerance:
        """The limits for a backend and dtype; on "tiny-random" weights the tiny ones where
        the registry states them (their spread differs from real weights')."""
        tiny = self.tiny_tolerances.get(backend, {}).get(dtype)
        if weights == "tiny-random" and tiny is not None:
            return tiny
        try:
            return self.tolerances[backend][dtype]
        except KeyError:
            have = ", ".join(f"{b}/{d}" for b, ds in self.tolerances.items() for d in ds)
            raise LinnetError(
                f"zoo entry {self.name} declares no tolerance for backend {backend} in {dtype} "
                f"(it has {have or 'none'})"
            ) from None

    def weights_map(self):
        """The weights map of this entry's architecture (and through it the source)."""
        from linnet.weights.maps import find_weights_map

        return find_weights_map(self.architecture)

    def matches(self, hf_config: dict) -> bool:
        """Whether a config.json describes this entry's model (architecture and shape); a
        diffusers config names its class in `_class_name`."""
        archs = hf_config.get("architectures") or [hf_config.get("_class_name")]
        if not self.ready or archs[0] != self.architecture:
            return False
        return _shape_agrees(self.config, hf_config)


def _shape_agrees(stated: dict, hf_config: dict) -> bool:
    """Every SHAPE_FIELDS value the entry states (nested towers too) is the config's."""
    keys = [k for k in SHAPE_FIELDS if k in stated]
    nested = [k for k in NESTED_CONFIGS if isinstance(stated.get(k), dict)]
    if not keys and not nested:
        return False
    same = all(hf_config.get(k) == stated[k] for k in keys)
    return same and all(_shape_agrees(stated[k], hf_config.get(k) or {}) for k in nested)


KINDS = ("decoder", "encoder", "vision", "speech", "image-text", "image-decoder", "unet")
KINDS += ("segmenter",)  # SAM (issue 15)
#: Kinds whose gate makes its own inputs (pixels, audio, latents): no prompts.
PROMPTLESS = ("vision", "speech", "image-text", "image-decoder", "unet", "segmenter")


class Registry:
    def __init__(self, entries: list[Entry], default_tolerances=None, kind_defaults=None):
        self.entries = {e.name: e for e in entries}
        #: [defaults.tolerances]: for a checkpoint that is no entry.
        self.defaults = Entry("(no entry)", "", "", "", tolerances=default_tolerances or {})
        #: kind -> the defaults for a checkpoint of that kind that is no entry
        self.kind_defaults = {"decoder": self.defaults, **(kind_defaults or {})}
        self.aliases = {a: e.name for e in entries for a in e.aliases}

    def __iter__(self):
        return iter(self.entries.values())

    def __contains__(self, name: str) -> bool:
        return name in self.entries or name in self.aliases

    def get(self, name: str) -> Entry:
        key = self.aliases.get(name, name)
        if key in self.entries:
            return self.entries[key]
        names = [*self.entries, *self.aliases]
        close = [n for n in names if name.lower() in n][:3]
        close = close or difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(close)}?" if close else "; see `linnet zoo list`"
        raise UnknownEntry(f"{name!r} is not a zoo entry{hint}")

    def ready(self) -> list[Entry]:
        return [e for e in self if e.ready]

    def decoders(self) -> list[Entry]:
        """The ready decoders (their gate is on logits)."""
        return self.of_kind("decoder")

    def of_kind(self, kind: str) -> list[Entry]:
        return [e for e in self.ready() if e.kind == kind]

    def planned(self) -> list[Entry]:
        return [e for e in self if not e.ready]

    def by_repo(self, repo: str) -> Entry | None:
        return next((e for e in self if e.repo.lower() == repo.lower()), None)

    def match_config(self, hf_config: dict) -> Entry | None:
        """The ready entry whose architecture and shape a config.json describes, if one does."""
        found = [e for e in self.ready() if e.matches(hf_config)]
        return found[0] if len(found) == 1 else None


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise LinnetError(f"{path}: cannot read the zoo registry: {e}") from e


def _tolerances(table: dict, where: str, kind: str = "decoder") -> dict[str, dict[str, Tolerance]]:
    """Each kind's limits: max_abs and rel, and top5 (decoders) or cosine (encoders)."""
    out: dict[str, dict[str, Tolerance]] = {}
    for backend, per_dtype in table.items():
        for dtype, spec in per_dtype.items():
            try:
                limits = (float(spec["max_abs"]), float(spec["rel"]))
                if kind == "encoder":  # the embeddings
                    tol = Tolerance(*limits, cosine=float(spec["cosine"]))
                elif kind == "decoder":
                    tol = Tolerance(*limits, top5=int(spec["top5"]))
                else:
                    tol = Tolerance(*limits)
            except (KeyError, TypeError, ValueError) as e:
                raise LinnetError(f"{where}: tolerance {backend}/{dtype}: {e!r}") from e
            out.setdefault(backend, {})[dtype] = tol
    return out


def read_revisions(path: Path = REVISIONS_FILE) -> dict[str, str]:
    """repo -> pinned commit hash, from revisions.toml."""
    if not path.is_file():
        return {}
    pins = _read(path)
    for repo, rev in pins.items():
        if not isinstance(rev, str) or not COMMIT_RE.fullmatch(rev):
            raise LinnetError(f"{path}: {repo} = {rev!r} is not a full commit hash")
    return pins


def write_revision(repo: str, revision: str, path: Path = REVISIONS_FILE) -> None:
    """Record (or replace) the pin of `repo` in revisions.toml, keeping its comments."""
    if not COMMIT_RE.fullmatch(revision):
        raise LinnetError(f"{revision!r} is not a full commit hash")
    line = f'"{repo}" = "{revision}"\n'
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.is_file() else []
    key = f'"{repo}"'
    lines = [ln for ln in lines if not ln.startswith(key + " ")]
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    path.write_text("".join(lines) + line, encoding="utf-8")


def _kind_defaults(defaults: dict, where: Path) -> dict[str, dict]:
    """kind -> its default tolerances: [defaults.tolerances] for decoders (on logits),
    [defaults.KIND.tolerances] for the others."""
    out = {"decoder": _tolerances(defaults.get("tolerances", {}), f"{where} [defaults]")}
    for kind in KINDS[1:]:
        table = defaults.get(kind, {}).get("tolerances", {})
        out[kind] = _tolerances(table, f"{where} [defaults.{kind}]", kind)
    return out


def _default_prompts(defaults: dict, kind: str, chat: bool) -> list[str]:
    if kind == "encoder":
        return defaults.get("sentences", [])
    return defaults.get("chat_prompts", []) if chat and kind == "decoder" else []


def _entry_tiny(tiny: dict, spec: dict, where: str) -> dict:
    """[defaults.tiny.tolerances], with what the entry's own [tiny.tolerances] states."""
    out = {b: dict(d) for b, d in tiny.items()}
    for backend, per in _tolerances(spec.get("tiny", {}).get("tolerances", {}), where).items():
        out.setdefault(backend, {}).update(per)
    return out


def _subfolder(spec: dict, where: str) -> str | None:
    """`subfolder`: one folder name of the repo (no nesting, no `..`), or None."""
    sub = spec.get("subfolder")
    if sub is None:
        return None
    if not (isinstance(sub, str) and re.fullmatch(r"[\w.-]+", sub)) or sub in (".", ".."):
        raise LinnetError(f"{where}: subfolder = {sub!r}: expected one folder name, e.g. 'unet'")
    return sub


def load_registry(entries: Path = ENTRIES_FILE, revisions: Path = REVISIONS_FILE) -> Registry:
    data = _read(entries)
    pins = read_revisions(revisions)
    defaults = data.get("defaults", {})
    kind_tols = _kind_defaults(defaults, entries)
    tiny = _tolerances(defaults.get("tiny", {}).get("tolerances", {}), f"{entries} [defaults.tiny]")
    out: list[Entry] = []
    for name, spec in data.get("entries", {}).items():
        where = f"{entries} [entries.{name}]"
        missing = [k for k in ("repo", "architecture", "license", "reference") if k not in spec]
        if missing:
            raise LinnetError(f"{where}: missing {', '.join(missing)}")
        own = "tolerances" in spec
        kind = spec.get("kind", "decoder")
        if kind not in KINDS:
            raise LinnetError(f"{where}: kind = {kind!r}: expected one of {', '.join(KINDS)}")
        tols = {b: dict(d) for b, d in kind_tols[kind].items()}
        for backend, per in _tolerances(spec.get("tolerances", {}), where, kind).items():
            tols.setdefault(backend, {}).update(per)
        chat = bool(spec.get("chat", kind == "decoder"))
        prompts = spec.get("prompts") or _default_prompts(defaults, kind, chat)
        if not prompts and kind not in PROMPTLESS:  # their gates make their own inputs
            raise LinnetError(f"{where}: no parity prompts")
        out.append(
            Entry(
                name=name,
                repo=spec["repo"],
                architecture=spec["architecture"],
                license=spec["license"],
                revision=pins.get(spec["repo"]),
                aliases=tuple(spec.get("aliases", ())),
                reference=spec["reference"],
                params=spec.get("params", ""),
                chat=chat,
                prompts=tuple(prompts),
                backends=tuple(spec.get("backends", defaults.get("backends", ()))),
                tolerances=tols,
                own_tolerances=own,
                tiny_tolerances=_entry_tiny(tiny, spec, where) if kind == "decoder" else {},
                config=dict(spec.get("config", {})),
                kind=kind,
                subfolder=_subfolder(spec, where),
            )
        )
    for name, spec in data.get("planned", {}).items():
        out.append(
            Entry(
                name=name,
                repo=spec["repo"],
                architecture=spec["architecture"],
                license=spec["license"],
                status="planned",
                revision=pins.get(spec["repo"]),
                needs=spec.get("needs", ""),
                subfolder=_subfolder(spec, f"{entries} [planned.{name}]"),
            )
        )
    kind_defaults = {
        kind: Entry(
            "(no entry)",
            "",
            "",
            "",
            tolerances=tols,
            kind=kind,
            tiny_tolerances=tiny if kind == "decoder" else {},
        )  # fmt: skip
        for kind, tols in kind_tols.items()
    }
    return Registry(out, kind_tols["decoder"], kind_defaults)


@lru_cache(maxsize=1)
def registry() -> Registry:
    """The registry shipped with Linnet (zoo/entries.toml and zoo/revisions.toml)."""
    return load_registry()


def get(name: str) -> Entry:
    return registry().get(name)
