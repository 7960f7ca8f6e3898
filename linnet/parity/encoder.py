"""Encoders: the sentences as one padded batch; per sentence, `embed` against
sentence-transformers' mean pooling over transformers' `AutoModel` last_hidden_state
(max |Δ|, rel, cosine) and `forward` against last_hidden_state at the real tokens.

    batch, mask = pad_batch(ids, pad_id)
    figures = measure_encoder(model, reference, batch, mask, tolerance, sentences)
"""

from __future__ import annotations

from linnet.parity.compare import compare
from linnet.parity.report import OutputFigures


def pad_batch(ids: list, pad_id: int):
    """[B, S] ids padded on the right with pad_id and the [B, S] mask of the real tokens,
    from one [1, S_i] (or [S_i]) LongTensor per sentence."""
    import torch

    rows = [torch.as_tensor(t).reshape(-1) for t in ids]
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)], mask[i, : len(r)] = r, 1
    return out, mask


def mean_pooling(hidden, mask):
    """sentence-transformers' `Pooling(mode="mean")`: the average of the rows the mask keeps."""
    weight = mask[..., None].to(hidden.dtype)
    return (hidden * weight).sum(1) / weight.sum(1).clamp(min=1e-9)


def measure_encoder(model, reference, ids, mask, tolerance, labels) -> list[OutputFigures]:
    """Per sentence: `embed` against mean pooling over transformers' last_hidden_state (max
    |Δ|, rel, cosine), and `forward` against last_hidden_state at its real tokens."""
    import numpy as np
    import torch

    with torch.no_grad():
        hidden = reference(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    want_embed = mean_pooling(hidden, mask)
    got_embed = torch.tensor(np.asarray(model.embed(ids, mask))).float()
    got_hidden = torch.tensor(np.asarray(model.run("forward", ids, mask))).float()
    out = []
    for i, label in enumerate(labels):
        n = int(mask[i].sum())
        cos = torch.nn.functional.cosine_similarity(got_embed[i], want_embed[i], dim=0)
        extra = dict(tokens=n, cosine=float(cos))
        out.append(compare(got_embed[i], want_embed[i], label, "embed", tolerance, **extra))
        got, want = got_hidden[i, :n], hidden[i, :n]
        out.append(compare(got, want, label, "forward", tolerance, tokens=n))
    return out
