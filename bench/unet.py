"""One UNet step at SDXL's structure scaled to fit a CPU: Linnet (PyTorch interpret,
generated equivalent and fast, ONNX on onnxruntime) against diffusers eager, under
torch.compile, and exported by torch.onnx (TorchScript exporter, opset 17: the dynamo one
needs onnxscript) on onnxruntime with Linnet's session options, batch 1, f32, on the same
random weights and inputs.

    python bench/unet.py [--scale small|sdxl-lite] [--repeats 5] [--skip METHOD] [--out FILE.json]

The checkpoint is a random UNet2DConditionModel with SDXL's block types, two layers per
level, linear projections and the text/time embedding; `small` (the default) has widths
(64, 128, 256), depths (1, 2, 4), heads of 64 (1, 2, 4), text states 77 x 512 and a 32 x 32
latent (SDXL: 320/640/1280, depths 1/2/10, 2048-wide text states, 128 x 128 latents).
Prints one line per method: median latency, its ratio to diffusers eager, and max |Δ| of the
output against diffusers eager. Results go to --out only when given (bench/results holds
the files the site renders; this one is not among them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, provenance, versions  # noqa: E402

SCALES = {
    "small": dict(widths=(64, 128, 256), depths=(1, 2, 4), heads=(1, 2, 4), cross=512, size=32),
    "sdxl-lite": dict(
        widths=(160, 320, 640), depths=(1, 2, 4), heads=(2, 5, 10), cross=1024, size=64
    ),
}


def build(folder: Path, scale: dict) -> None:
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=scale["size"],
        block_out_channels=scale["widths"],
        layers_per_block=2,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=scale["depths"],
        attention_head_dim=scale["heads"],
        cross_attention_dim=scale["cross"],
        norm_num_groups=32,
        addition_embed_type="text_time",
        addition_time_embed_dim=64,
        projection_class_embeddings_input_dim=scale["widths"][-1] + 6 * 64,
        use_linear_projection=True,
    ).eval()
    model.save_pretrained(folder)


def make_inputs(scale: dict) -> tuple:
    import torch

    g = torch.Generator().manual_seed(1)
    size = scale["size"]
    return (
        torch.randn(1, 4, size, size, generator=g),
        torch.tensor([500.0]),
        torch.randn(1, 77, scale["cross"], generator=g),
        torch.randn(1, scale["widths"][-1], generator=g),
        torch.tensor([[8.0 * size, 8.0 * size, 0, 0, 8.0 * size, 8.0 * size]]),
    )


def methods(folder: Path, work: Path) -> dict:
    """name -> a function (inputs) -> zero-argument call returning a numpy output."""
    import numpy as np
    import torch

    def linnet_torch(mode, numerics):
        import linnet.torch as lt

        model = lt.load(folder, mode=mode, numerics=numerics)
        return lambda args: lambda: model.run("forward", *args).numpy()

    def linnet_onnx():
        import linnet.onnx

        model = linnet.onnx.load(linnet.onnx.export(folder, work / "onnx", progress=False))
        return lambda args: lambda: np.asarray(model.run("forward", *[a.numpy() for a in args]))

    def diffusers(compiled):
        from diffusers import UNet2DConditionModel

        model = UNet2DConditionModel.from_pretrained(folder, trust_remote_code=False).eval()
        run = torch.compile(model) if compiled else model

        def bind(args):
            sample, t, states, text, ids = args
            extra = {"text_embeds": text, "time_ids": ids}

            @torch.no_grad()
            def call():
                return run(sample, t, states, added_cond_kwargs=extra).sample.numpy()

            return call

        return bind

    return {
        "diffusers onnx (torch.onnx, onnxruntime)": lambda: diffusers_onnx(folder, work),
        "linnet interpret": lambda: linnet_torch("interpret", "equivalent"),
        "linnet generated, equivalent": lambda: linnet_torch("generated", "equivalent"),
        "linnet generated, fast": lambda: linnet_torch("generated", "fast"),
        "linnet onnx (onnxruntime)": linnet_onnx,
        "diffusers eager": lambda: diffusers(False),
        "diffusers compile": lambda: diffusers(True),
    }


def diffusers_onnx(folder: Path, work: Path):
    """diffusers' UNet through torch.onnx.export (traced at the benchmark's inputs), run by
    onnxruntime with default SessionOptions on the CPU, as Linnet's export runs."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from diffusers import UNet2DConditionModel

    class Step(torch.nn.Module):  # five positional tensors -> the noise prediction
        def __init__(self, unet):
            super().__init__()
            self.unet = unet

        def forward(self, sample, t, states, text, ids):
            extra = {"text_embeds": text, "time_ids": ids}
            return self.unet(sample, t, states, added_cond_kwargs=extra).sample

    unet = UNet2DConditionModel.from_pretrained(folder, trust_remote_code=False).eval()
    path = work / "diffusers-unet.onnx"
    names = ["sample", "timestep", "encoder_hidden_states", "text_embeds", "time_ids"]

    def bind(args):
        if not path.exists():
            with torch.no_grad():
                torch.onnx.export(
                    Step(unet), args, str(path), dynamo=False, input_names=names,
                    output_names=["noise"], opset_version=17,
                )  # fmt: skip
        session = ort.InferenceSession(
            str(path), ort.SessionOptions(), providers=["CPUExecutionProvider"]
        )
        feeds = {n: a.numpy() for n, a in zip(names, args)}
        return lambda: np.asarray(session.run(None, feeds)[0])

    return bind


def time_call(call, repeats: int) -> tuple:
    out = call()  # warm-up (compiles where a method compiles)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip", action="append", default=[], help="a method to leave out")
    opts = parser.parse_args()
    import numpy as np

    scale = SCALES[opts.scale]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "unet"
        build(folder, scale)
        args = make_inputs(scale)
        for name, prepare in methods(folder, Path(tmp)).items():
            if name in opts.skip:
                continue
            try:
                seconds, out = time_call(prepare()(args), opts.repeats)
            except Exception as e:  # a method that fails is recorded, not fatal
                rows.append({"method": name, "error": f"{type(e).__name__}: {e}"[:300]})
                print(f"{name:32s} failed: {rows[-1]['error']}", flush=True)
                continue
            rows.append({"method": name, "median_s": seconds, "output": out})
            print(f"{name:32s} {seconds * 1e3:9.1f} ms", flush=True)
        eager = next(r for r in rows if r["method"] == "diffusers eager" and "median_s" in r)
        reference = eager["output"]
        print("-- against diffusers eager:")
        for row in rows:
            if "median_s" not in row:
                continue
            out = row.pop("output")
            row["max_abs_delta"] = float(np.abs(out - reference).max())
            row["vs_diffusers_eager"] = eager["median_s"] / row["median_s"]
            print(
                f"{row['method']:32s} {row['median_s'] * 1e3:9.1f} ms  "
                f"{row['vs_diffusers_eager']:5.2f}x eager  max |Δ| {row['max_abs_delta']:.1e}"
            )
    record = {
        "benchmark": "unet",
        "scale": {opts.scale: scale},
        "rows": rows,
        "machine": machine(),
        "versions": versions(["torch", "diffusers", "onnxruntime"]),
        **provenance(),
    }
    if opts.out:
        opts.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
