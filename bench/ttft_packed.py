#!/usr/bin/env python
"""TTFT for a 512-token prompt, one thread, CPU time, interleaved rounds: Linnet generated/fast
(q8_0 packed: the prefill takes the blocked PyTorch path above 64 rows) vs llama.cpp, same GGUF.

    python bench/ttft_packed.py MODEL.gguf q8_0 ROUNDS
"""

import json
import statistics
import sys
import time

import llama_cpp
import torch

import linnet.torch as lt

torch.set_num_threads(1)
gguf = sys.argv[1]
dtype = sys.argv[2]
rounds = int(sys.argv[3])
model = lt.load(gguf, dtype=dtype, mode="generated", numerics="fast")
llm = llama_cpp.Llama(gguf, n_ctx=1024, n_threads=1, n_threads_batch=1, n_batch=512, verbose=False)
ids = torch.randint(0, 49152, (1, 512), generator=torch.Generator().manual_seed(0))


def lin():
    model.reset()
    t = time.process_time()
    model.decode(ids, 0)
    return time.process_time() - t


def cpp():
    llm.reset()
    t = time.process_time()
    llm.eval(ids[0].tolist())
    return time.process_time() - t


lin()
cpp()
res = {"linnet": [], "llama.cpp": []}
for _ in range(rounds):
    res["linnet"].append(lin())
    res["llama.cpp"].append(cpp())
print(json.dumps({k: {"median_s": statistics.median(v), "rounds": v} for k, v in res.items()}))
