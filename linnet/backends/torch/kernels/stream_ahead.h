// Decode on two cores: the step's thread and a helper of Linnet's own (docs/torch.md,
// "Session 25", "Session 26"). The step's ops other than its linears and its Python run on
// one thread either way, and with each linear split over torch's threads the memory idled
// through them. So a one-token step may run on the calling thread (stream_ahead.py, torch
// set to one thread for it) with a helper thread on the other core that does two things:
// it takes part of each decode linear's rows (`parallel_rows`), and in between it reads
// the weights the step will want next into the shared L3, where the step reads them at
// twice DRAM's speed. The decode linears tell the helper which weight they start
// (`reading`); it learns their cycle, one step's worth, and keeps the next `budget` bytes
// after the current weight on their way, also while the serial part runs.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace linnet {

// Whether the calling thread runs a step under the helper (the `stream_ahead_step` op).
bool stepping();
// The helper's side of a weight the step is about to read (its storage's bytes it spans).
void note_weight(const at::Tensor& w);

// A decode linear's weights: noted when this thread's step runs under the helper.
inline void reading(const at::Tensor& w) {
  if (stepping()) note_weight(w);
}

// Whether the helper also takes part of each linear's rows (the `stream_ahead_share` op).
bool sharing();
using RowsFn = void (*)(const void* fn, int64_t lo, int64_t hi);
// [begin, end) in chunks of at least `grain`, claimed by this thread and the helper in turn.
void share_rows(int64_t begin, int64_t end, int64_t grain, RowsFn call, const void* fn);

// The threads a decode linear may split its work over.
inline int threads() { return stepping() && sharing() ? 2 : at::get_num_threads(); }

// at::parallel_for for a decode linear: under a shared step (torch at one thread), the
// rows split between this thread and the helper, which reads ahead again when it is done.
template <class F>
void parallel_rows(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (stepping() && sharing()) {
    const RowsFn call = [](const void* fn, int64_t lo, int64_t hi) {
      (*static_cast<const F*>(fn))(lo, hi);
    };
    share_rows(begin, end, grain, call, &f);
    return;
  }
  at::parallel_for(begin, end, grain, f);
}

}  // namespace linnet
