// The helper thread of stream_ahead.h. The caller's side learns the cycle of weights a step
// reads (from the first weight noted until it comes round again), then publishes where in
// that cycle it is; the helper runs chunks of a linear's rows when the step posts them,
// else reads a byte of every line after the weight being read, up to the budget, and
// sleeps once no step has run for a while (the step then runs all its rows itself).
// Reads, not prefetches: on the Zen 4 EPYC another core's prefetched lines were read at
// DRAM's 27 GB/s, loaded ones at 51.
// A read must never touch freed memory, so the plan holds weak references to the weights'
// storages and the helper reads a weight only while it holds its storage alive and the
// storage still holds those bytes. Every piece of state is made once and never destroyed:
// a helper still running while the process exits touches nothing freed.
#include "stream_ahead.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <pthread.h>
#include <sched.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LINNET_PAUSE() _mm_pause()
#else
#define LINNET_PAUSE() ((void)0)
#endif

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kLine = 64;
constexpr int64_t kChunk = 16384;                    // bytes read between looks at the caller
constexpr auto kAwake = std::chrono::milliseconds(2);  // spin this long after the last note
constexpr size_t kMaxLearning = 1 << 16;              // weights; past it, no cycle: start again
constexpr int64_t kShareChunks = 8;  // a shared linear's pieces, claimed by either thread

struct Weight {
  const char* at;
  int64_t bytes;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
};

// One step's weights in the order read: each one's offset along the cycle, and its index.
struct Plan {
  std::vector<Weight> weights;
  std::vector<int64_t> start;
  int64_t total = 0;
  std::unordered_map<const char*, int64_t> index;

  explicit Plan(std::vector<Weight> seq) : weights(std::move(seq)) {
    for (size_t i = 0; i < weights.size(); ++i) {
      index.emplace(weights[i].at, static_cast<int64_t>(i));
      start.push_back(total);
      total += weights[i].bytes;
    }
  }
  int64_t holding(int64_t off) const {  // the weight holding cycle offset `off`
    return static_cast<int64_t>(std::upper_bound(start.begin(), start.end(), off) - start.begin()) - 1;
  }
};

// A linear's rows shared between the step's thread and the helper: each claims the next
// chunk until none is left.
struct Rows {
  linnet::RowsFn call;
  const void* fn;
  int64_t begin, n, chunks;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // the first chunk's exception, rethrown on the step's thread

  Rows(linnet::RowsFn c, const void* f, int64_t b, int64_t len, int64_t k)
      : call(c), fn(f), begin(b), n(len), chunks(k) {}
  int64_t run() {  // answers how many chunks this thread ran
    int64_t ran = 0;
    for (int64_t c; (c = next.fetch_add(1)) < chunks; ++ran) {
      try {
        call(fn, begin + n * c / chunks, begin + n * (c + 1) / chunks);
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
    return ran;
  }
};

struct State {
  std::atomic<int64_t> budget{0};
  std::atomic<bool> share{true};
  std::atomic<Rows*> rows{nullptr};       // the linear being shared, posted by the step
  std::atomic<bool> helper_in{false};     // the helper may be in `rows`: the step waits
  std::atomic<int64_t> shared_chunks{0};  // run by the helper, for tests and benchmarks
  std::atomic<int64_t> reading_end{0};  // along the cycles: the end of the weight being read
  std::atomic<uint64_t> version{0};     // one more with every plan published
  std::atomic<bool> asleep{false};
  std::atomic<bool> no_helper{false};   // no helper thread here: a child of fork(), or none made
  std::atomic<int> caller_cpu{-1};
  std::atomic<int64_t> bytes_read{0};   // by the helper, for tests and benchmarks
  std::atomic<int64_t> sink{0};
  std::mutex plan_mu;
  std::shared_ptr<const Plan> plan;  // under plan_mu: what the helper follows
  std::mutex wake_mu;
  std::condition_variable wake;
  std::once_flag started;
  // the caller's side, under note_mu
  std::mutex note_mu;
  std::vector<Weight> learning;
  std::shared_ptr<const Plan> known;
  int64_t cur = -1, cycle = 0;
};

State& state() {
  static State* s = new State;  // never destroyed: see the top of the file
  return *s;
}

thread_local bool this_thread_steps = false;

void publish(State& s, std::shared_ptr<const Plan> plan) {
  std::lock_guard<std::mutex> lock(s.plan_mu);
  s.plan = std::move(plan);
  s.version.fetch_add(1);
}

// Read a byte of each line from cycle offset `along` on, at most `len` bytes and not past
// the weight's end; answers how far it got (a weight whose storage is gone is passed over).
int64_t read_ahead(State& s, const Plan& plan, int64_t along, int64_t len) {
  const int64_t off = along % plan.total, i = plan.holding(off);
  const Weight& w = plan.weights[i];
  const int64_t into = off - plan.start[i], n = std::min(len, w.bytes - into);
  const c10::intrusive_ptr<c10::StorageImpl> alive = w.storage.lock();
  if (!alive) return n;
  const char* base = static_cast<const char*>(alive->data());
  if (w.at < base || w.at + w.bytes > base + alive->nbytes()) return n;  // its bytes moved
  int64_t sum = 0;
  for (int64_t j = 0; j < n; j += kLine) sum += *reinterpret_cast<const volatile char*>(w.at + into + j);
  s.sink.fetch_add(sum, std::memory_order_relaxed);
  s.bytes_read.fetch_add(n, std::memory_order_relaxed);
  return n;
}

// The scheduler wakes a thread on its waker's CPU; sharing that core would halve the step.
void leave_cpu(int cpu, const cpu_set_t& allowed) {
  if (cpu < 0 || sched_getcpu() != cpu || CPU_COUNT(&allowed) < 2) return;
  cpu_set_t others = allowed;
  CPU_CLR(cpu, &others);
  if (CPU_COUNT(&others) > 0) sched_setaffinity(0, sizeof(others), &others);
}

void helper() {
  State& s = state();
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) CPU_ZERO(&allowed);
  std::shared_ptr<const Plan> plan;
  uint64_t version = ~uint64_t{0};
  int64_t along = 0, seen = -1;
  auto last_note = Clock::now();
  for (;;) {
    if (s.share.load(std::memory_order_relaxed)) {  // a linear's rows first: the step waits
      s.helper_in.store(true);  // seq_cst, as the step's store of rows and load of helper_in
      Rows* rows = s.rows.load();
      if (rows) s.shared_chunks.fetch_add(rows->run(), std::memory_order_relaxed);
      s.helper_in.store(false);
      if (rows) {
        last_note = Clock::now();
        continue;
      }
    }
    const uint64_t v = s.version.load();
    if (v != version) {
      std::lock_guard<std::mutex> lock(s.plan_mu);
      plan = s.plan, version = v, along = 0;
    }
    const int64_t end = s.reading_end.load();
    if (end != seen) {
      seen = end, last_note = Clock::now();
      leave_cpu(s.caller_cpu.load(std::memory_order_relaxed), allowed);
    }
    const int64_t budget = s.budget.load(std::memory_order_relaxed);
    if (plan && plan->total > 0 && budget > 0) {
      along = std::max(along, end);
      const int64_t limit = end + std::min(budget, plan->total);  // never a lap ahead
      if (along < limit) {
        along += read_ahead(s, *plan, along, std::min(limit - along, kChunk));
        continue;
      }
    }
    if (Clock::now() - last_note < kAwake) {
      for (int i = 0; i < 32; ++i) LINNET_PAUSE();
      continue;
    }
    std::unique_lock<std::mutex> lock(s.wake_mu);  // no step for a while: sleep until a note
    s.asleep.store(true);
    s.wake.wait_for(lock, std::chrono::seconds(1),
                    [&] { return s.reading_end.load() != seen || s.version.load() != version; });
    s.asleep.store(false);
    last_note = Clock::now();
  }
}

void wake_helper(State& s) {
  if (!s.asleep.load()) return;
  { std::lock_guard<std::mutex> lock(s.wake_mu); }
  s.wake.notify_one();
}

// A weight the step starts: its place in the known cycle, or one more step of learning it.
void note(State& s, const at::Tensor& w) {
  const char* p = static_cast<const char*>(w.data_ptr());
  const int64_t bytes = static_cast<int64_t>(w.nbytes());
  if (s.known) {
    const Plan& plan = *s.known;
    const int64_t n = static_cast<int64_t>(plan.weights.size());
    int64_t i = s.cur + 1 == n ? 0 : s.cur + 1;
    if (plan.weights[i].at != p) {
      const auto it = plan.index.find(p);
      i = it == plan.index.end() ? -1 : it->second;
    }
    if (i >= 0 && plan.weights[i].bytes == bytes) {
      if (i <= s.cur) ++s.cycle;
      s.cur = i;
      s.reading_end.store(s.cycle * plan.total + plan.start[i] + bytes);
      wake_helper(s);
      return;
    }
    s.known.reset();  // a weight outside the cycle: learn again from this one
    s.learning.clear();
    publish(s, nullptr);
  }
  if (!s.learning.empty() && s.learning.front().at == p) {  // round again: a cycle
    s.known = std::make_shared<const Plan>(std::move(s.learning));
    s.learning = {};
    s.cur = 0, s.cycle = 0;
    s.reading_end.store(s.known->weights[0].bytes);
    publish(s, s.known);
    wake_helper(s);
    return;
  }
  if (s.learning.size() >= kMaxLearning) s.learning.clear();
  s.learning.push_back({p, bytes, w.storage().getWeakStorageImpl()});
}

// The calling thread's steps under the helper on (a budget set) or off; answers the state before.
bool stream_ahead_step(bool on) {
  State& s = state();
  const bool before = this_thread_steps;
  if (on && s.budget.load() > 0)
    std::call_once(s.started, [&] {
      pthread_atfork(nullptr, nullptr, [] { state().no_helper.store(true); });
      try {
        std::thread(helper).detach();
      } catch (const std::system_error&) {  // no thread to be had: never stream
        s.no_helper.store(true);
      }
    });
  this_thread_steps = on && s.budget.load() > 0 && !s.no_helper.load();
  return before;
}

// Set the budget (bytes read ahead; 0: none); answers the one before.
int64_t stream_ahead(int64_t budget) {
  TORCH_CHECK(budget >= 0, "stream_ahead: bytes >= 0");
  return state().budget.exchange(budget);
}

// The helper takes part of each decode linear's rows (on) or only reads ahead; answers the
// setting before.
bool stream_ahead_share(bool on) { return state().share.exchange(on); }

// [bytes the helper has read, weights in the learned cycle (0: none yet), chunks of shared
// linears the helper ran]
std::vector<int64_t> stream_ahead_stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.note_mu);
  return {s.bytes_read.load(), s.known ? static_cast<int64_t>(s.known->weights.size()) : 0,
          s.shared_chunks.load()};
}

}  // namespace

namespace linnet {

bool stepping() { return this_thread_steps; }

bool sharing() { return state().share.load(std::memory_order_relaxed); }

void share_rows(int64_t begin, int64_t end, int64_t grain, RowsFn call, const void* fn) {
  State& s = state();
  const int64_t n = end - begin;
  const int64_t chunks = std::min(kShareChunks, n / std::max<int64_t>(grain, 1));
  if (chunks < 2) {
    if (n > 0) call(fn, begin, end);
    return;
  }
  Rows rows(call, fn, begin, n, chunks);
  s.rows.store(&rows);
  rows.run();
  s.rows.store(nullptr);  // then wait until the helper is out of `rows`, which dies here
  // (yielding now and then: were it woken onto this CPU, the helper could not finish)
  for (int spins = 1; s.helper_in.load(); ++spins) {
    if (spins % 4096)
      LINNET_PAUSE();
    else
      std::this_thread::yield();
  }
  if (rows.failed.load()) std::rethrow_exception(rows.error);
}

void note_weight(const at::Tensor& w) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.note_mu, std::try_to_lock);
  if (!lock.owns_lock() || !w.defined() || w.nbytes() == 0) return;
  s.caller_cpu.store(sched_getcpu(), std::memory_order_relaxed);
  note(s, w);
}

}  // namespace linnet

TORCH_LIBRARY_FRAGMENT(linnet_kernels, m) {
  m.def("stream_ahead(int bytes) -> int", stream_ahead);
  m.def("stream_ahead_step(bool on) -> bool", stream_ahead_step);
  m.def("stream_ahead_share(bool on) -> bool", stream_ahead_share);
  m.def("stream_ahead_stats() -> int[]", stream_ahead_stats);
}
