"""Rows at their own positions (issue 13): `model.rows(R)` (linnet/rows.py) over the source's
`decode_rows` entry, on every backend, against transformers and against each request alone.

One schedule serves five requests of mixed lengths on four rows, as a server would: two
prompts first, two more prefilled (one in several chunks) while the first two are
decoding, a fifth waiting until a finished row is freed and reused; every step advances
only the rows still generating, each at its own position. Each request's greedy tokens
must equal its solo run (`model.decode`, one request at a time) and transformers' greedy
tokens, and every logits row must lie within F32_TOL of transformers' at that position.
Mistral's sliding window (8) is shorter than every request but the shortest.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import linnet.jax
import linnet.onnx
import linnet.torch as lt
from linnet.errors import LinnetError
from tests.checkpoints import reference_greedy, reference_logits
from tests.numeric import assert_close

F32_TOL = 1e-4  # f32 logits, as tests/backends/test_outside_reference.py
POSITIONS = 64  # cache slots: rows hold POSITIONS - 1 tokens
NEW = 10  # greedy tokens per request
CHUNK = 4  # prefill chunk: the 20-token prompt takes five
PROMPT_LENGTHS = (5, 11, 3, 20, 7)
ARRIVALS = (0, 0, 3, 3, 4)  # the iteration each request may start; the fifth waits for a row
ROW_COUNT = 4
DECODER_VARIANTS = [
    ("llama", "base"),
    ("llama", "tied"),
    ("mistral", "base"),
    ("qwen2", "base"),
    ("qwen3", "base"),
    ("phi3", "window"),
    ("gpt2", "base"),  # learned positions: wpe[positions(at, S)]
]


def prompts(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(13)
    return [rng.integers(0, vocab, n).tolist() for n in PROMPT_LENGTHS]


def load(folder, backend: str, tmp_path):
    if backend.startswith("torch-"):
        return lt.load(folder, max_positions=POSITIONS, mode=backend[len("torch-") :])
    if backend == "jax":
        return linnet.jax.load(folder, max_positions=POSITIONS)
    out = linnet.onnx.export(folder, tmp_path / "onnx", max_positions=POSITIONS, progress=False)
    return linnet.onnx.load(out)


def serve(rows, requests: list[list[int]]) -> tuple[dict, dict, dict]:
    """Run the schedule: (request -> greedy tokens, request -> logits per token,
    request -> the row it got)."""
    pending, active = list(range(len(requests))), {}
    tokens = {i: [] for i in pending}
    logits = {i: [] for i in pending}
    placed = {}
    iteration = 0
    while pending or active:
        for row in range(rows.rows):
            if row not in active and pending and ARRIVALS[pending[0]] <= iteration:
                req = pending.pop(0)
                assert rows.length(row) == 0, "a freed row starts empty"
                _record(tokens[req], logits[req], rows.prefill(row, requests[req]))
                active[row], placed[req] = req, row
        live = sorted(r for r in active if len(tokens[active[r]]) < NEW)
        if live:
            out = rows.step(live, [tokens[active[r]][-1] for r in live])
            assert out.shape == (len(live), rows.model.config["vocab"])
            for r, row_logits in zip(live, out):
                _record(tokens[active[r]], logits[active[r]], row_logits)
        for r in [r for r in active if len(tokens[active[r]]) == NEW]:
            assert rows.length(r) == len(requests[active[r]]) + NEW - 1
            rows.free(r)
            del active[r]
        iteration += 1
    return tokens, logits, placed


def _record(tokens: list, logits: list, row_logits: np.ndarray) -> None:
    assert isinstance(row_logits, np.ndarray) and row_logits.dtype == np.float32
    tokens.append(int(row_logits.argmax()))
    logits.append(row_logits)


def solo(model, prompt: list[int]) -> list[int]:
    """Greedy tokens of one request alone, through `decode` (no rows)."""
    model.reset()
    out = model.decode([prompt], 0)
    got = [int(np.asarray(_numpy(out)).argmax())]
    for pos in range(len(prompt), len(prompt) + NEW - 1):
        got.append(int(np.asarray(_numpy(model.decode([[got[-1]]], pos))).argmax()))
    return got


def _numpy(x) -> np.ndarray:
    return np.asarray(x.detach().float() if isinstance(x, torch.Tensor) else x, np.float32)


@functools.cache
def reference(folder, prompt: tuple[int, ...]) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and its logits at each position that chose one."""
    full = reference_greedy(folder, torch.tensor([prompt]), NEW)[0]
    logits = reference_logits(folder, full[None, :-1])[0, len(prompt) - 1 :]
    return full[len(prompt) :].tolist(), logits.numpy()


def check_schedule(model, folder) -> None:
    requests = prompts(model.config["vocab"])
    rows = model.rows(ROW_COUNT)
    rows.chunk = CHUNK
    tokens, logits, placed = serve(rows, requests)
    reused = list(placed.values()).count(placed[4]) == 2
    assert reused, f"the fifth request must reuse a freed row: {placed}"
    for i, prompt in enumerate(requests):
        want_tokens, want_logits = reference(folder, tuple(prompt))
        assert tokens[i] == want_tokens, f"request {i}: rows {tokens[i]} != HF {want_tokens}"
        assert_close(np.stack(logits[i]), want_logits, atol=F32_TOL, what=f"request {i} logits")
        assert tokens[i] == solo(model, prompt), f"request {i}: rows differ from its solo run"


@pytest.mark.parametrize("arch,variant", DECODER_VARIANTS, ids=lambda x: str(x))
def test_rows_interpret_every_decoder_variant(tiny_checkpoint, tmp_path, arch, variant):
    folder = tiny_checkpoint(arch, variant)
    check_schedule(load(folder, "torch-interpret", tmp_path), folder)


@pytest.mark.parametrize("backend", ["torch-generated", "jax", "onnx"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2"])
def test_rows_backends(tiny_checkpoint, tmp_path, backend, arch):
    folder = tiny_checkpoint(arch)
    check_schedule(load(folder, backend, tmp_path), folder)


@pytest.mark.slow
def test_rows_compile(tiny_checkpoint, tmp_path):
    folder = tiny_checkpoint("mistral")
    check_schedule(load(folder, "torch-compile", tmp_path), folder)


@pytest.mark.parametrize("backend", ["torch-interpret", "jax", "onnx"])
def test_prefill_and_step_leave_other_rows_alone(tiny_checkpoint, tmp_path, backend):
    """The cached keys and values of every token a row holds are unchanged, bit for bit, by
    a call that does not name the row (a step feeds idle rows their next slot, which lies
    past what they hold; on PyTorch a step computes the rows from the first it names to
    the last, so row 1 sits inside the span of the step of rows 0 and 2)."""
    model = load(tiny_checkpoint("llama"), backend, tmp_path)
    rows = model.rows(3)
    rows.chunk = CHUNK
    rows.prefill(0, list(range(9)))
    rows.prefill(2, list(range(20, 26)))
    for call, touched in (
        (lambda: rows.prefill(1, list(range(30, 41))), {1}),
        (lambda: rows.step([1], [7]), {1}),
        (lambda: rows.prefill(0, [3, 4]), {0}),
        (lambda: rows.step([0, 2], [7, 8]), {0, 2}),
    ):
        before = _row_snapshot(rows)
        call()
        after = _row_snapshot(rows)
        for r in range(3):
            same = all(np.array_equal(before[n][r], after[n][r]) for n in before)
            assert same == (r not in touched), f"row {r} {'changed' if same else 'kept'} wrongly"


def _row_snapshot(rows) -> dict:
    """state -> [the cache slots of the tokens each row holds, as numpy]."""
    out = {}
    for name, x in rows.state.items():
        array = x.numpy() if type(x).__name__ == "OrtValue" else _numpy(x)
        out[name] = []
        for r in range(rows.rows):
            row = np.take(array, r, axis=rows.row_axes[name])
            slots = row.shape.index(POSITIONS)  # the position axis (no other is 64 here)
            out[name].append(np.take(row, range(rows.length(r)), axis=slots).copy())
    return out


def test_rows_refuse_what_does_not_fit(tiny_checkpoint, tmp_path):
    model = load(tiny_checkpoint("llama"), "torch-interpret", tmp_path)
    with pytest.raises(LinnetError, match="positions"):
        model.rows(2, positions=POSITIONS)  # one slot is kept for idle full rows
    rows = model.rows(2, positions=8)
    rows.prefill(0, list(range(8)))
    with pytest.raises(LinnetError, match="row 0 holds 8 of 8"):
        rows.step([0], [1])
    with pytest.raises(LinnetError, match="do not fit"):
        rows.prefill(1, list(range(9)))
    with pytest.raises(LinnetError, match="distinct rows"):
        rows.step([1, 1], [2, 3])
    with pytest.raises(LinnetError, match="row must be"):
        rows.step([2], [2])
    assert rows.length(0) == 8 and rows.length(1) == 0
    rows.free(0)
    assert rows.length(0) == 0
    rows.prefill(0, [5])  # a freed row takes a new prompt
    assert rows.length(0) == 1


@pytest.mark.parametrize("backend", ["torch-interpret", "jax", "onnx"])
def test_prefill_appends_to_what_a_row_holds(tiny_checkpoint, tmp_path, backend):
    """A second prefill (a chat's next turn) continues from the row's length: its logits
    are transformers' after the whole text; the row next to it is another request."""
    folder = tiny_checkpoint("mistral")
    model = load(folder, backend, tmp_path)
    text = prompts(model.config["vocab"])[3]  # 20 tokens, past the window of 8
    want = reference_logits(folder, torch.tensor([text]))[0].numpy()
    rows = model.rows(2)
    rows.chunk = CHUNK
    rows.prefill(1, text[:9])
    rows.prefill(0, text[:6])
    first = rows.prefill(0, text[6:13])
    rows.step([1], [text[9]])
    last = rows.prefill(0, text[13:])
    assert rows.length(0) == len(text)
    assert_close(np.stack([first, last]), want[[12, -1]], atol=F32_TOL, what="appended prefill")


@pytest.mark.parametrize("backend", ["torch-interpret", "jax", "onnx"])
def test_decode_rows_takes_several_tokens_per_row(tiny_checkpoint, tmp_path, backend):
    """The entry itself with S = 3 new tokens on rows of lengths 4, 11 and 0 (the rows
    decoder steps one at a time): each row's last logits are transformers' after its text."""
    folder = tiny_checkpoint("mistral")
    model = load(folder, backend, tmp_path)
    texts = [p + p[:3] for p in prompts(model.config["vocab"])[:3]]  # 8, 14 and 6 tokens
    held = [4, 11, 0]
    rows = model.rows(3)
    for r, n in enumerate(held):
        if n:
            rows.prefill(r, texts[r][:n])
    tokens = np.array([t[n : n + 3] for t, n in zip(texts, held)])
    at = np.array(held)
    with rows._all_rows():
        got = model.run("decode_rows", tokens, at, reach=int(at.max()))
    for r, (text, n) in enumerate(zip(texts, held)):
        want = reference_logits(folder, torch.tensor([text[: n + 3]]))[0, -1].numpy()
        assert_close(_numpy(got)[r], want, atol=F32_TOL, what=f"row {r} after {n + 3} tokens")


def _scatter_rows(x, axis, row_axis, positions, update):
    """The per-row cache write as torch's scatter_ states it (the reference)."""
    shape = [1] * x.dim()
    shape[row_axis], shape[axis] = positions.shape
    return x.scatter_(axis, positions.reshape(shape).expand_as(update), update)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "cut",
    [
        None,  # a split state, one layer's keys: (B, heads, N, D)
        (slice(1, 2), slice(0, 1), slice(0, 4), slice(0, 3)),  # the whole state's slice
        (slice(0, 1), slice(1, 2), slice(1, 3), slice(0, 3)),  # rows 1..2 only
        (slice(1, 2), slice(0, 1), slice(0, 4), slice(0, 2)),  # 2 of 3 heads: scatter_
        (slice(0, 1), slice(1, 2), slice(0, 4), slice(0, 3), slice(None), slice(0, 4)),
    ],
)
def test_write_rows_equals_scatter(dtype, cut):
    """`write_rows` (the generated code's per-row cache write: one index_copy_ where the
    target's leading axes are one view, scatter_ otherwise) writes what scatter_ writes."""
    from linnet.backends.torch.prelude import write_rows

    gen = torch.Generator().manual_seed(0)
    whole = torch.randn(2, 2, 4, 3, 10, 8, generator=gen).to(dtype)  # (layers, k/v, B, ...)
    if cut is None:
        whole, cut, axis, row_axis = whole[0, 0], (), 2, 0
    else:
        axis, row_axis = 4, 2
    shape = list(whole[cut].shape)
    positions = torch.tensor([[0, 1], [5, 6], [8, 9], [2, 3]])[: shape[row_axis]]
    shape[axis] = 2
    update = torch.randn(shape, generator=gen).to(dtype)
    got, want = whole.clone(), whole.clone()
    write_rows(got[cut], axis, row_axis, positions, update)
    _scatter_rows(want[cut], axis, row_axis, positions, update)
    assert torch.equal(got, want)


def test_onnx_rows_survive_a_plain_decode_and_freed_memory(tiny_checkpoint, tmp_path):
    """The cache rows a server holds live in numpy buffers onnxruntime writes in place; a
    plain `decode` on the same model (which resets its own state) and the garbage collector
    must never free them. Memory freed under them would be reused by the junk allocated
    here, and the next step would read it (or crash): the logits must equal those of an
    undisturbed run of the same calls."""
    import gc

    folder = tiny_checkpoint("llama")

    def run(disturb: bool) -> list[np.ndarray]:
        model = load(folder, "onnx", tmp_path / ("disturbed" if disturb else "quiet"))
        rows = model.rows(2)
        out = [rows.prefill(0, [1, 2, 3]), rows.prefill(1, [4, 5])]
        token = [int(out[0].argmax()), int(out[1].argmax())]
        for _ in range(4):
            step = rows.step([0, 1], token)  # every row: the whole cache is the step's state
            out.append(step)
            token = [int(t) for t in step.argmax(axis=1)]
            if disturb:
                solo(model, [7, 8, 9])  # model.reset() and a plain decode on the same model
                gc.collect()
                junk = [np.full(x.shape(), 1e4, np.float32) for x in rows.state.values()]
                del junk
        return out

    for i, (quiet, disturbed) in enumerate(zip(run(False), run(True))):
        np.testing.assert_array_equal(disturbed, quiet, err_msg=f"call {i}")
