"""`linnet export hf|gguf|onnx SRC --out ...` and `linnet push DIR --repo ORG/NAME`.

SRC is an HF checkpoint folder, a .gguf file or (with the zoo) an entry name. Each
format is a command on the `export` group.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from linnet.converters.gguf_types import GGUF_DTYPES


@click.group()
def export() -> None:
    """Export a checkpoint (HF folder, .gguf file or zoo name) to another format."""


@export.command("hf")
@click.argument("src")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="folder")
@click.option("--dtype", default=None, help="f32, f16 or bf16 (default: as stored)")
@click.option("--max-shard-size", default="5GB", show_default=True, help="e.g. 5GB, 500MB")
@click.option("--force", is_flag=True, help="replace an existing folder")
@click.option("--quiet", is_flag=True, help="no progress bar")
def export_hf(src: str, out: Path, dtype, max_shard_size: str, force: bool, quiet: bool) -> None:
    """Sharded safetensors, config, generation config and tokenizer, named as the original."""
    import linnet.hf

    path = linnet.hf.export(
        src,
        out,
        dtype=dtype,
        max_shard_size=max_shard_size,
        overwrite=force,
        progress=not quiet,
    )
    files = sorted(p.name for p in path.iterdir())
    click.echo(f"wrote {path}: {', '.join(files)}")


@export.command("gguf")
@click.argument("src")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="file")
@click.option(
    "--dtype",
    default="f16",
    show_default=True,
    type=click.Choice(GGUF_DTYPES, case_sensitive=False),
    help="llama.cpp's type names (any case): q4_k_m, Q6_K, ...",
)
@click.option("--no-tokenizer", is_flag=True, help="write no tokenizer (llama.cpp takes ids)")
@click.option("--force", is_flag=True, help="replace an existing file")
@click.option("--quiet", is_flag=True, help="no progress bar")
def export_gguf(src: str, out: Path, dtype: str, no_tokenizer: bool, force: bool, quiet: bool):
    """One GGUF file with llama.cpp's names, metadata, tokenizer and chat template."""
    import linnet.gguf

    path = linnet.gguf.export(
        src,
        out,
        dtype=dtype,
        tokenizer=False if no_tokenizer else None,
        overwrite=force,
        progress=not quiet,
    )
    click.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {dtype})")


@export.command("onnx")
@click.argument("src")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="folder")
@click.option("--dtype", default=None, help="f32, f16 or bf16 (default: as stored)")
@click.option("--max-positions", type=int, default=None, help="KV-cache rows (default ≤4096)")
@click.option("--force", is_flag=True, help="replace an existing folder")
@click.option("--quiet", is_flag=True, help="no progress bar")
def export_onnx(src: str, out: Path, dtype, max_positions, force: bool, quiet: bool) -> None:
    """One ONNX model per entry point (forward, decode with its KV cache), emitted from
    the Core IR, sharing one external weights file; onnxruntime runs it."""
    import linnet.onnx

    path = linnet.onnx.export(
        src, out, dtype=dtype, max_positions=max_positions, overwrite=force, progress=not quiet
    )
    files = sorted(p.name for p in path.iterdir())
    click.echo(f"wrote {path}: {', '.join(files)}")


@click.command()
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--repo", required=True, help="ORG/NAME on the Hub")
@click.option("--private", is_flag=True, help="create the repository private")
@click.option("--base-model", default=None, help="the model this was made from (HF repo id)")
@click.option("--parity", type=click.Path(path_type=Path), default=None, help="parity JSON")
@click.option("--license", "license_", default=None, help="e.g. apache-2.0")
@click.option("--made-with", default=None, help="how it was made (default: inferred)")
@click.option("--message", default=None, help="commit message")
@click.option("--endpoint", default=None, help="Hub URL (default: HF_ENDPOINT or the Hub)")
@click.option("--token", default=None, help="token (default: HF_TOKEN or the login)")
def push(folder, repo, private, base_model, parity, license_, made_with, message, endpoint, token):
    """Upload an exported folder to the Hub with a generated model card."""
    from linnet.hub_push import push as push_folder

    record = None
    if parity is not None:
        try:
            record = json.loads(Path(parity).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            click.echo(f"error: {parity}: cannot read the parity record: {e}", err=True)
            sys.exit(2)
    url = push_folder(
        folder,
        repo,
        private=private,
        base_model=base_model,
        parity=record,
        license=license_,
        made_with=made_with,
        commit_message=message,
        endpoint=endpoint,
        token=token,
    )
    click.echo(f"pushed {folder} to {repo}: {url}")
