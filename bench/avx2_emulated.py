#!/usr/bin/env python
"""bench/packed_decode.py or bench/ttft_packed.py with both sides on their AVX2 code, on an
AVX-512 CPU: what a CPU without AVX512-BF16 (an AVX2-only EPYC, say) runs, when none is at
hand. Not that CPU's memory system: the figures are this machine's bandwidth.

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
      -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
      pip wheel --no-deps llama-cpp-python==0.3.36 -w /tmp/wheel    # about 7 minutes
    pip install --no-deps --target /tmp/llama_avx2 /tmp/wheel/llama_cpp_python-*.whl
    python bench/avx2_emulated.py decode --llama-cpp /tmp/llama_avx2 --dtypes bf16,f32 \
      --out bench/results/checks/packed_decode_avx2_emulated.json [--threads 2]

- llama.cpp: the build under `--llama-cpp` (refused unless its system info has AVX2 and
  no AVX-512);
- Linnet's kernels: built with `-march=x86-64-v3` (their AVX2 branches; another build key,
  so the native library stays);
- PyTorch: dispatched to AVX2 (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS,
  ONEDNN_MAX_CPU_ISA, set before torch is imported) and its bf16/fp16 probes answering
  False, so Linnet picks what it picks on such a CPU (bf16 linears column-major, say).
The record gets an `emulation` field saying all of this.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}
PROBES = (
    "_is_avx512_bf16_supported",
    "_is_amx_tile_supported",
    "_is_avx512_fp16_supported",
    "_is_amx_fp16_supported",
)
KERNEL_FLAGS = ("-O3", "-march=x86-64-v3")


def emulate(llama_cpp: Path) -> str:
    """Set everything up before torch and llama_cpp are imported; llama.cpp's system info."""
    os.environ.update(ENV)
    sys.path.insert(0, str(llama_cpp))
    sys.path.insert(0, str(ROOT))
    import torch

    for probe in PROBES:
        setattr(torch.cpu, probe, lambda: False)
    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        sys.exit(f"torch dispatches to {torch.backends.cpu.get_cpu_capability()}, not AVX2")
    from linnet.backends.torch import kernels

    kernels.FLAGS = KERNEL_FLAGS
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    if "AVX2 = 1" not in info or "AVX512 = 1" in info:
        sys.exit(f"{llama_cpp.__file__}: not an AVX2 build without AVX-512 ({info.strip()})")
    return info.strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("bench", choices=("decode", "ttft"))
    parser.add_argument("--llama-cpp", type=Path, required=True, help="an AVX2 build's folder")
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1, help="decode: 2 times the wall clock")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    info = emulate(args.llama_cpp)
    from bench import packed_decode, ttft_packed

    rest = ["--dtypes", args.dtypes, "--out", str(args.out)]
    if args.bench == "decode":
        threads = ["--threads", str(args.threads)]
        rc = packed_decode.main([*rest, *threads, "--rounds", str(args.rounds or 5)])
    else:
        rc = ttft_packed.main([*rest, "--rounds", str(args.rounds or 3)])
    record = json.loads(args.out.read_text())
    record["emulation"] = {
        "env": ENV,
        "linnet_kernel_flags": list(KERNEL_FLAGS),
        "llama_cpp": info,
        "torch_lowp_probes": "patched to False",
        "note": "an AVX-512 CPU running AVX2 code paths on both sides; not an AVX2-only "
        "CPU's memory system",
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
