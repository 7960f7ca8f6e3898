#!/usr/bin/env bash
# The JAX path without torch: a fresh virtual environment under /tmp with only
# `pip install -e '.[jax]'` (pinned by constraints.txt), a tiny Llama-family checkpoint
# written with numpy alone, then linnet.jax end to end: load (f32 and bf16), forward,
# prefill + decode against forward, greedy generation, `linnet jax`, and a StableHLO
# export run back through linnet.jax.load(from_stablehlo=...). Fails if torch gets imported.
# The outside reference: transformers (which needs torch) runs in the main environment
# ($REFERENCE_PYTHON, default .venv/bin/python) on the same checkpoint and ids first and
# writes its logits to a .npy; the JAX-only environment compares its outputs with that file.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
REF_PY=${REFERENCE_PYTHON:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d /tmp/linnet-jax-only.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
t0=$(date +%s)

"$PY" -m venv "$WORK/venv"
. "$WORK/venv/bin/activate"
{ pip install -q --upgrade pip && pip install -q -c constraints.txt -e '.[jax]'; } \
  >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log" >&2; exit 1; }
if python -c "import torch" 2>/dev/null; then
  echo "check_jax_only: torch is importable in the jax-only environment" >&2
  exit 1
fi

cd "$WORK"  # run from outside the repository: the installed package, not the tree
python - "$WORK/tiny" <<'EOF'
"""A tiny random LlamaForCausalLM checkpoint (GQA 4:2, tied head) written with numpy."""
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

out = Path(sys.argv[1])
out.mkdir()
vocab, dim, layers, heads, kv, ffn = 96, 32, 2, 4, 2, 64
config = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
    "hidden_size": dim, "intermediate_size": ffn, "num_hidden_layers": layers,
    "num_attention_heads": heads, "num_key_value_heads": kv, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
    "torch_dtype": "float32",
}
(out / "config.json").write_text(json.dumps(config, indent=2))
rng = np.random.default_rng(0)
hd = dim // heads


def w(*shape, std=0.1):
    return (rng.standard_normal(shape) * std).astype(np.float32)


tensors = {"model.embed_tokens.weight": w(vocab, dim, std=0.5),
           "model.norm.weight": 1 + w(dim)}
for i in range(layers):
    p = f"model.layers.{i}."
    tensors.update({
        p + "input_layernorm.weight": 1 + w(dim),
        p + "post_attention_layernorm.weight": 1 + w(dim),
        p + "self_attn.q_proj.weight": w(heads * hd, dim),
        p + "self_attn.k_proj.weight": w(kv * hd, dim),
        p + "self_attn.v_proj.weight": w(kv * hd, dim),
        p + "self_attn.o_proj.weight": w(dim, heads * hd),
        p + "mlp.gate_proj.weight": w(ffn, dim),
        p + "mlp.up_proj.weight": w(ffn, dim),
        p + "mlp.down_proj.weight": w(dim, ffn),
    })
save_file(tensors, str(out / "model.safetensors"))
print(f"check_jax_only: wrote {out} ({len(tensors)} tensors)")
EOF

HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$REF_PY" - "$WORK" <<'EOF'
"""transformers' logits on the tiny checkpoint (main environment): ids.npy, reference.npy."""
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

work = sys.argv[1]
ids = np.random.default_rng(1).integers(0, 96, (2, 20))
model = AutoModelForCausalLM.from_pretrained(
    f"{work}/tiny", dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
).eval()
with torch.no_grad():
    logits = model(input_ids=torch.from_numpy(ids)).logits.numpy()
np.save(f"{work}/ids.npy", ids)
np.save(f"{work}/reference.npy", logits)
print(f"check_jax_only: transformers wrote reference logits {logits.shape}")
EOF

linnet jax "$WORK/tiny" -o "$WORK/tiny_jax.py"
linnet stablehlo "$WORK/tiny" --entry forward -o "$WORK/hlo/forward.mlir"
linnet stablehlo "$WORK/tiny" --entry decode -o "$WORK/hlo/decode.mlir"

python - "$WORK" <<'EOF'
import sys

import numpy as np

import linnet.jax as lj

work = sys.argv[1]
ids = np.load(f"{work}/ids.npy")
reference = np.load(f"{work}/reference.npy")  # transformers, from the main environment


def check(name, got, want, tol):
    assert np.shape(got) == np.shape(want), f"{name}: shape {np.shape(got)} != {np.shape(want)}"
    delta = float(np.abs(np.asarray(got) - np.asarray(want)).max())
    print(f"check_jax_only: {name}: max |Δ| {delta:.3g}")
    assert delta <= tol, f"{name}: max |Δ| {delta:.3g} > {tol}"


model = lj.load(f"{work}/tiny", dtype="f32")
full = model.forward(ids)
check("f32 forward vs transformers", full, reference, 1e-4)
model.decode(ids[:, :12], 0)
for pos in range(12, 20):
    last = model.decode(ids[:, pos : pos + 1], pos)
    check(f"f32 decode at {pos} vs transformers", last, reference[:, pos], 1e-4)
check("f32 prefill + 8 decode steps vs forward", last, full[:, -1], 1e-4)
tokens = model.generate(ids[:, :12], 6)
assert tokens.shape == (2, 18), tokens.shape

exported = lj.load(f"{work}/tiny", dtype="f32", from_stablehlo=f"{work}/hlo")
check("StableHLO forward vs jit", exported.forward(ids), full, 1e-6)
check("StableHLO forward vs transformers", exported.forward(ids), reference, 1e-4)
assert np.asarray(exported.generate(ids[:, :12], 6)).tolist() == np.asarray(tokens).tolist()

bf16 = lj.load(f"{work}/tiny", dtype="bf16", numerics="fast")
logits = bf16.forward(ids)
assert str(logits.dtype) == "float32" and bool(np.isfinite(np.asarray(logits)).all())
check("bf16 (fast) vs transformers f32", logits, reference, 0.5)
assert "torch" not in sys.modules, "the JAX path imported torch"
print("check_jax_only: OK, torch never imported")
EOF
echo "check_jax_only: passed in $(( $(date +%s) - t0 ))s"
