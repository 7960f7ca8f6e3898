"""`linnet zoo list | show | pull | lock`: the zoo's entries and pulling them from the Hub."""

from __future__ import annotations

import contextlib
import sys
import warnings

import click


def fail_hub(err) -> None:
    """Print a hub error and exit with its code (3 not found, 4 unreachable, 5 integrity)."""
    click.echo(f"error: {err}", err=True)
    sys.exit(err.exit_code)


@contextlib.contextmanager
def warnings_to_stderr():
    """Show warnings (an unpinned pull) as `warning: ...` lines, not Python's format."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                click.echo(f"warning: {w.message}", err=True)


def _parity_status(records: list[dict], name: str) -> str:
    """'f32 ✓ bf16 ✕' per weights kind, from the latest parity records of an entry."""
    marks: dict[str, list[str]] = {}
    for r in sorted(records, key=lambda r: (r.get("weights", ""), r.get("dtype", ""))):
        if r.get("entry") != name:
            continue
        kind = "tiny" if r.get("weights") != "real" else "real"
        marks.setdefault(kind, []).append(f"{r.get('dtype')} {'✓' if r.get('passed') else '✕'}")
    if not marks:
        return "not run"
    return "; ".join(f"{kind}: {' '.join(m)}" for kind, m in sorted(marks.items()))


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


@click.group()
def zoo() -> None:
    """The zoo: entries (HF repo, pinned revision, source, weights map, tolerances)."""


@zoo.command("list")
@click.option("--results", default=None, help="parity records folder (default results/parity)")
def list_(results: str | None) -> None:
    """A table of every entry: kind, architecture, parameters, backends, revision, parity."""
    from linnet.parity import read_records
    from linnet.zoo.registry import registry

    records = read_records(results)
    rows = [("name", "kind", "architecture", "params", "backends", "revision", "parity")]
    reg = registry()
    for e in reg.ready():
        rev = e.revision[:12] if e.pinned else "unpinned"
        rows.append(
            (e.name, e.kind, e.architecture, e.params, ",".join(e.backends), rev,
             _parity_status(records, e.name))
        )  # fmt: skip
    for e in reg.planned():
        rows.append((e.name, "-", e.architecture, "", "-", "", f"planned: needs {e.needs}"))
    click.echo(_table(rows))
    n_unpinned = sum(not e.pinned for e in reg.ready())
    click.echo(
        f"\n{len(reg.ready())} ready ({n_unpinned} unpinned: `linnet zoo lock` pins them), "
        f"{len(reg.planned())} planned"
    )


#: `zoo show` for the kinds whose gates make their own inputs (no tokenizer, or one unused).
_NO_TOKENIZER = {
    "vision": "none: pixels are preprocessed outside the model",
    "image-decoder": "none: latents in, an image out",
    "segmenter": "none: pixels, points and boxes in, masks out",
    "unet": "none: latents and text states in (a text encoder makes them)",
    "speech": "optional: the gate feeds audio it makes and generation_config.json's start tokens",
}
_MADE_INPUTS = {
    "vision": "random pixels (images)",
    "speech": "audio the gate makes (tones, a chirp, noise)",
    "image-text": "random pixels and token ids",
    "image-decoder": "random latents",
    "segmenter": "random pixels, points (every label kind) and boxes",
    "unet": "random latents, text states, pooled text; two timesteps; SDXL-like time ids",
}


@zoo.command()
@click.argument("name")
def show(name: str) -> None:
    """Everything an entry declares."""
    from linnet.zoo.registry import registry

    e = registry().get(name)
    lines = [
        f"name          {e.name}" + (f" (alias {', '.join(e.aliases)})" if e.aliases else ""),
        f"status        {e.status}" + (f": needs {e.needs}" if e.needs else ""),
        f"kind          {e.kind}" if e.ready else "",
        f"repo          {e.repo}",
        f"revision      {e.revision or 'unpinned (default branch; `linnet zoo lock` pins it)'}",
        f"architecture  {e.architecture}",
        f"license       {e.license}",
    ]
    if e.ready:
        m = e.weights_map()
        lines += [
            f"source        zoo/{m.source}.linnet",
            f"weights map   weights_maps/{m.path.name} (with the config translation)",
            "tokenizer     "
            + (
                _NO_TOKENIZER[e.kind]
                if e.kind in _NO_TOKENIZER
                else "the repo's own (transformers AutoTokenizer"
                + (", chat template)" if e.chat else ")")
            ),
            f"reference     {e.reference}",
            f"parameters    {e.params}",
            f"backends      {', '.join(e.backends)}",
            "prompts       "
            + ("\n              ".join(repr(p) for p in e.prompts) or _MADE_INPUTS[e.kind]),
            "tolerances    "
            + ("" if e.own_tolerances else "(the registry's defaults) ")
            + "\n              ".join(
                f"{b} {d}: {t.text()}" for b, ds in e.tolerances.items() for d, t in ds.items()
            ),
        ]
        if e.config:
            cfg = ", ".join(f"{k}={v}" for k, v in e.config.items())
            lines.append(f"config        {cfg}")
    click.echo("\n".join(line for line in lines if line))


@zoo.command()
@click.argument("name")
@click.option("--revision", default=None, help="a branch, tag or commit instead of the pin")
@click.option("--dtype", default=None, help="dtype the plan checks for (f32, bf16, f16)")
@click.option("--repo", default=None, help="pull this repo (a mirror or fork) for the entry")
def pull(name: str, revision: str | None, dtype: str | None, repo: str | None) -> None:
    """Download an entry (or an HF repo id) into the HF cache, planned first, then verified."""
    from linnet.hub import HubError
    from linnet.hub import pull as hub_pull

    with warnings_to_stderr():
        try:
            result = hub_pull(name, revision=revision, dtype=dtype, repo=repo)
        except HubError as err:
            fail_hub(err)
    plan = result.plan
    n = sum(r.loads for r in plan.rows)
    source = " (from the cache; the Hub was not used)" if result.offline else ""
    click.echo(
        f"{result.repo} @ {result.commit}{source}\n"
        f"  {len(result.files)} files, {result.downloaded / 1e6:.1f} MB downloaded in "
        f"{result.seconds:.1f} s; sha256 verified\n"
        f"  plan: {n} tensors -> {plan.architecture} on zoo/{plan.source}.linnet ({plan.dtype})\n"
        f"{result.folder}"
    )


@zoo.command()
@click.argument("names", nargs=-1)
def lock(names: tuple[str, ...]) -> None:
    """Pin unpinned entries (or NAMES) to the current commit of their default branch."""
    from linnet.hub import HubError
    from linnet.hub import lock as hub_lock

    try:
        done = hub_lock(list(names) or None)
    except HubError as err:
        fail_hub(err)
    if not done:
        click.echo("every entry is pinned already")
    for name, commit in done.items():
        click.echo(f"{name}: {commit}")
