"""One rank of a tensor-parallel test run (tests/parallel/test_torch_tp.py starts one
process per rank with torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    python tp_worker.py OUT_DIR JOB_JSON

JOB_JSON: {"checkpoints": [...], "modes": [...], "ids": [[...]], "new_tokens": n,
"die_rank": r or null}. Each rank writes OUT_DIR/rank{r}.json: per checkpoint and mode the
forward logits (rank 0 only, as .pt beside it) and greedy tokens, or the error it ended with.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch


def main() -> int:
    out, job = Path(sys.argv[1]), json.loads(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    import linnet.torch

    report: dict = {"rank": rank, "runs": {}}
    ids = torch.tensor(job["ids"], dtype=torch.long)
    try:
        for ck in job["checkpoints"]:
            for mode in job["modes"]:
                model = linnet.torch.load(ck, dtype="f32", mode=mode, tensor_parallel=world)
                if job.get("die_rank") == rank:
                    os._exit(3)  # a rank that dies after loading, before the first collective
                logits = model.forward(ids)
                tokens = model.generate(ids, job["new_tokens"])
                key = f"{Path(ck).name}:{mode}"
                if rank == 0:
                    torch.save(logits, out / f"{key.replace(':', '-')}.pt")
                report["runs"][key] = {"tokens": tokens.tolist()}
                count = sum(t.numel() for t in model.params.values())
                report.setdefault("param_elements", {})[Path(ck).name] = count
    except Exception as e:  # the test reads what each rank ended with
        report["error"] = f"{type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc()
        (out / f"rank{rank}.json").write_text(json.dumps(report))
        return 1
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
