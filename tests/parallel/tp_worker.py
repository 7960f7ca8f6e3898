"""One rank of a tensor-parallel test run (tests/parallel/test_torch_tp.py starts one
process per rank with torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    python tp_worker.py OUT_DIR JOB_JSON

JOB_JSON: {"checkpoints": [...], "modes": [...], "ids": [[...]], "new_tokens": n,
"die_rank": r or null, "packed": [[checkpoint, dtype], ...], "device": "cpu" or "cuda"}.
Each rank writes OUT_DIR/rank{r}.json: per checkpoint and mode the forward logits (rank 0
only, as .pt beside it) and greedy tokens, or the error it ended with; its peak RSS before
and after each load, and its anonymous memory before and at most during each load.
Packed runs are in mode generated, keyed `name:generated:dtype`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import traceback
from pathlib import Path

import torch


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: ru_maxrss would keep the peak of the pytest process
    that started it, which survives fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: KiB


def anon_mb() -> float:
    """This process's anonymous RSS (RssAnon): what it holds, without mapped file pages."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return 0.0


class AnonPeak:
    """The largest `anon_mb` seen while the block runs, sampled every millisecond from a
    thread (it gets the GIL at least every 5 ms; the copies of a load run longer). VmHWM's
    growth also counts the file pages a load's memory map touches, and those depend on
    who else read the checkpoint: a fault maps a whole large folio another process's read
    left in the page cache, and SmolLM2's rank 0 grew 664 MiB instead of 428 in a full
    suite run (2026-12-04) with the same code."""

    def __enter__(self):
        self.before = self.peak = anon_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, anon_mb())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, anon_mb())


def drop_cached_pages(checkpoint: str) -> None:
    """Evict the checkpoint's safetensors files from the page cache, so the load's RSS
    growth counts the pages its memory map touches as a file read from disk would. A file
    written moments before (scripts/make_smollm2_checkpoint.py at the start of a CI run)
    sits in large folios (FileHugePages), and a fault then maps a whole folio: SmolLM2's
    rank 0 grew 482 MiB by its load instead of 429 on a 6.18 kernel (2026-12-03)."""
    folder = Path(checkpoint)
    for f in folder.glob("*.safetensors") if folder.is_dir() else ():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> int:
    out, job = Path(sys.argv[1]), json.loads(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    import linnet.torch

    report: dict = {"rank": rank, "runs": {}}
    ids = torch.tensor(job["ids"], dtype=torch.long)
    runs = [(ck, mode, "f32") for ck in job["checkpoints"] for mode in job["modes"]]
    runs += [(ck, "generated", dtype) for ck, dtype in job.get("packed", [])]
    try:
        for ck, mode, dtype in runs:
            drop_cached_pages(ck)
            before = peak_rss_mb()
            with AnonPeak() as anon:
                model = linnet.torch.load(
                    ck,
                    dtype=dtype,
                    mode=mode,
                    tensor_parallel=world,
                    device=job.get("device", "cpu"),
                )
            if job.get("die_rank") == rank:
                os._exit(3)  # a rank that dies after loading, before the first collective
            memory = {"peak_rss_mb_before_load": before, "peak_rss_mb_after_load": peak_rss_mb()}
            memory |= {"anon_mb_before_load": anon.before, "peak_anon_mb_during_load": anon.peak}
            logits = model.forward(ids)
            tokens = model.generate(ids, job["new_tokens"])
            key = f"{Path(ck).name}:{mode}" + ("" if dtype == "f32" else f":{dtype}")
            if rank == 0:
                torch.save(logits.cpu(), out / f"{key.replace(':', '-')}.pt")
            memory["peak_rss_mb_at_end"] = peak_rss_mb()  # after the forward and the tokens
            report["runs"][key] = {"tokens": tokens.tolist(), **memory}
            if dtype == "f32":
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
