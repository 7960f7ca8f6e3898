"""bench/train.py's record (`"suite": "training"`) as site rows: one row per trainer (SFT,
DPO, GRPO) and method (Linnet on PyTorch or JAX, TRL + PEFT), with the step time, tokens
per second, peak RSS, the last step's loss, the held-out loss and, for GRPO, the mean
reward; a failed run is a row with its error.

    rows = training_rows(data, path, entry_for)
"""

from __future__ import annotations

from pathlib import Path

from linnet.site.bench import TRAINING_METRICS, BenchRow, SiteError, figures_of, ratios_text


def training_rows(data: dict, path: Path, entry_for) -> list[BenchRow]:
    model = str(data.get("model"))
    runs = data["runs"]
    if not isinstance(runs, dict):
        raise SiteError(f"{path}: a training record's runs are not an object")
    rows = []
    for kind, methods in runs.items():
        if not isinstance(methods, dict):
            raise SiteError(f"{path}: a training record's {kind} runs are not an object")
        for method, cell in methods.items():
            if not isinstance(cell, dict):
                raise SiteError(f"{path}: {kind} {method} is not an object")
            failed = str(cell.get("error") or "")
            notes = "; ".join(p for p in (failed, ratios_text(cell.get("vs"))) if p)
            rows.append(
                BenchRow(
                    model,
                    entry_for(model),
                    "real weights",
                    method,
                    f"LoRA {kind.upper()}",
                    figures_of(cell, TRAINING_METRICS),
                    notes,
                    not failed,
                    path.name,
                )
            )
    return rows
