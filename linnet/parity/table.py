"""The parity report as a text table, one line per prompt (decoders) or per input and
output (encoders, vision), then the verdict.

    print(format_table(report))
"""

from __future__ import annotations

from linnet.parity.report import Report


def format_table(report: Report) -> str:
    lines = _decoder_rows(report) if report.kind == "decoder" else _output_rows(report)
    name = report.entry or report.checkpoint
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(
        f"\nparity {verdict}: {name}, {report.backend} {report.dtype} on {report.device} "
        f"({report.weights} weights); tolerance {report.tolerance.text()}"
    )
    if report.kind in INPUTS:
        lines.append(f"input: {INPUTS[report.kind]}")
    return "\n".join(lines)


#: What the gate fed each kind that makes its own inputs.
INPUTS = {
    "vision": "deterministic random pixels (no image files offline)",
    "speech": "audio the gate makes (tones, a chirp, noise; seed 0) through Linnet's log-mel "
    "front end; the start tokens of generation_config.json",
    "image-text": "deterministic random pixels and token ids (seed 0)",
    "image-decoder": "deterministic random latents (seed 0)",
    "segmenter": "deterministic random pixels, points with every label kind and boxes (seed 0)",
    "unet": "deterministic random latents, text states and pooled text (seed 0), timesteps "
    "999 and 17, SDXL-like time ids",
}


def _short(text: str, width: int = 28) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _result(f) -> str:
    return "ok" if f.passed else "FAIL: " + f.why


def _decoder_rows(report: Report) -> list[str]:
    head = (
        f"{'prompt':<28} {'tokens':>6} {'linnet':>7} {'ref':>7} {'same':>4} "
        f"{'max |Δ|':>9} {'rel':>9} {'top-5':>5}  result"
    )
    lines = [head]
    for f in report.figures:
        lines.append(
            f"{_short(f.prompt):<28} {f.tokens:>6} {f.linnet_token:>7} {f.reference_token:>7} "
            f"{'yes' if f.same_token else 'NO':>4} {f.max_abs:>9.2e} {f.rel:>9.2e} "
            f"{f.top5:>3}/5  {_result(f)}"
        )
    return lines


def _output_rows(report: Report) -> list[str]:
    """Encoders and the kinds with made inputs: one line per input and output."""
    first = "input" if report.kind in INPUTS else "prompt"
    head = f"{first:<28} {'output':<8} {'tokens':>6} {'max |Δ|':>9} {'rel':>9} {'cosine':>10} "
    lines = [head + f"{'top-1':>5}  result"]
    for f in report.figures:
        cosine = f"{f.cosine:.8f}" if f.cosine is not None else "-"
        top1 = f"{f.top1}/{f.rows}" if f.top1 is not None else "-"
        tokens = str(f.tokens) if f.tokens else "-"
        lines.append(
            f"{_short(f.prompt):<28} {f.output:<8} {tokens:>6} {f.max_abs:>9.2e} {f.rel:>9.2e} "
            f"{cosine:>10} {top1:>5}  {_result(f)}"
        )
    return lines
