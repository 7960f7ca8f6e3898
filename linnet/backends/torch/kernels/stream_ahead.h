// Decode on two cores by streaming, not splitting (docs/torch.md, "Session 25"). One thread
// already reads a step's weights about as fast as two do (bf16 on the Zen 4 EPYC: 25-28
// GB/s either way), and the step's other ops and its Python then leave the memory idle.
// So a one-token step may run on the calling thread alone (stream_ahead.py, torch
// set to one thread for it) while a helper thread on the other core reads the weights the
// step will want next into the shared L3, where the step reads them at twice DRAM's speed.
// The decode linears tell the helper which weight they start (`reading`); it learns
// their cycle, one step's worth, and keeps the next `budget` bytes after the current weight
// on their way, also while the serial part runs.
#pragma once

#include <ATen/core/Tensor.h>

namespace linnet {

// Whether the calling thread runs a step under the helper (the `stream_ahead_step` op).
bool stepping();
// The helper's side of a weight the step is about to read (its storage's bytes it spans).
void note_weight(const at::Tensor& w);

// A decode linear's weights: noted when this thread's step runs under the helper.
inline void reading(const at::Tensor& w) {
  if (stepping()) note_weight(w);
}

}  // namespace linnet
