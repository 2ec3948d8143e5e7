#include "cache/anchorkv_streaming.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "cache/anchorkv_segments.h"
#include "core/background.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/parallel.h"

namespace anchorkv::internal {

// What a background compression reads: its own copies, nothing of the state.
struct ClosingInputs {
  AnchorKVConfig cfg;
  std::shared_ptr<const compress::ResidualCodec> codec;
  CacheShape shape;
  int64_t pos0 = 0, tokens = 0;
  core::UninitVector<float> kv;  // [rows, tokens, D] K, then V
  cache::ObservationQueries queries;
  std::optional<AnchorKVSegment> extend;  // a copy of the segment it extends
  NewSegment compress() const {
    const int64_t half = shape.rows() * tokens * shape.D;
    return compress_segment(cfg, *codec, shape, pos0, tokens, kv.data(), kv.data() + half, queries, true,
                            extend ? &*extend : nullptr);
  }
  // Whether `last` is still the segment it extends, and may be extended
  // (a restore point may have sealed it since): else it must not commit.
  bool extends(const AnchorKVSegment* last) const {
    return !extend || (last && !last->sealed && last->pos0 == extend->pos0 && last->tokens == extend->tokens);
  }
};

// A cache that goes away mid-closing waits for its job (at most one
// segment's compression), so no job outlives every cache. A forked child
// has no worker running it: there the job is never waited for.
struct ClosingSegment {
  std::shared_ptr<const ClosingInputs> inputs;
  std::shared_future<NewSegment> result;
  pid_t process = getpid();  // whose worker runs the job
  ClosingSegment() = default;
  ClosingSegment(const ClosingSegment&) = delete;
  ClosingSegment& operator=(const ClosingSegment&) = delete;
  ~ClosingSegment() {
    if (result.valid() && in_its_process()) result.wait();
  }
  bool in_its_process() const { return getpid() == process; }
};

namespace {

std::shared_ptr<ClosingSegment> start_closing(std::shared_ptr<ClosingInputs> inputs) {
  auto c = std::make_shared<ClosingSegment>();
  c->inputs = inputs;
  c->result = core::in_background([inputs] { return inputs->compress(); });
  return c;
}

// The closing segment's result; a job that failed (memory) or that a
// forked child inherited from its parent is redone here, and one that
// extends a segment the state no longer ends with, or that was sealed
// since, is redone on its own.
NewSegment finish_closing(const ClosingSegment& c, const AnchorKVState& st) {
  if (!c.inputs->extends(st.segments.empty() ? nullptr : &st.segments.back())) {
    ClosingInputs alone = *c.inputs;
    alone.extend.reset();
    return alone.compress();
  }
  // A forked child never reads the parent's future: the worker may have
  // held its state's lock at the fork, and nothing in the child unlocks it.
  // Compressing again gives the same bits.
  if (!c.in_its_process()) return c.inputs->compress();
  try {
    return c.result.get();
  } catch (const std::exception&) {
    return c.inputs->compress();
  }
}

// The K/V [rows, T, D] of positions [a, a + T) of tail ++ input.
void gather_stream(const AnchorKVState& st, const cache::StagedInput& in, int64_t rows, int64_t D, int64_t a,
                   int64_t T, float* K, float* V) {
  const int64_t t0 = st.tail.tokens;
  core::parallel_for(rows, st.config.threads, [&](int64_t r) {
    const int64_t n_tail = std::clamp<int64_t>(t0 - a, 0, T), from = std::max<int64_t>(a - t0, 0);
    float* k = K + r * T * D;
    float* v = V + r * T * D;
    if (n_tail > 0) {
      core::f16_to_f32_n(st.tail.k[r].data() + a * D, k, n_tail * D);
      core::f16_to_f32_n(st.tail.v[r].data() + a * D, v, n_tail * D);
    }
    std::copy_n(in.key_row(r) + from * D, (T - n_tail) * D, k + n_tail * D);
    std::copy_n(in.value_row(r) + from * D, (T - n_tail) * D, v + n_tail * D);
  });
}

// The query window a call leaves behind: `st`'s, or a new one when the
// call's queries have another shape (allocated here, so the commit that
// pushes the call's queries cannot throw). No `given` when the call brings none.
struct WindowUpdate {
  cache::QueryWindow fresh;
  bool replaces = false;
  const cache::ObservationQueries* given = nullptr;
};

WindowUpdate plan_window(const AnchorKVState& st, const cache::StagedInput& in, int64_t rows) {
  WindowUpdate u;
  if (in.queries.empty()) return u;
  u.given = &in.queries;
  if (!st.recent_queries.fits(in.queries, rows)) {
    u.fresh = cache::QueryWindow(rows, in.queries.G, in.queries.D, std::max<int64_t>(st.config.window, 1));
    u.replaces = true;
  }
  return u;
}

// The queries that score segments closing in this call: the window with the
// call's queries pushed (a copy; segments close once per segment_tokens).
cache::ObservationQueries closing_queries(const AnchorKVState& st, const WindowUpdate& u) {
  if (!u.given) return st.recent_queries.ordered();
  cache::QueryWindow w = u.replaces ? u.fresh : st.recent_queries;
  w.push(*u.given);
  return w.ordered();
}

void commit_window(AnchorKVState& st, WindowUpdate&& u) noexcept {
  if (!u.given) return;
  if (u.replaces) st.recent_queries = std::move(u.fresh);
  st.recent_queries.push(*u.given);
}

// What one call does to the tail ++ input sequence: its first `taken` tokens
// leave for segments (the closing one first, then those closed here), and
// a decode step may start compressing the next T.
// A multi-token call (a prompt, a chunk) closes up to this many
// segment_tokens in one segment: attention's cost grows with the segment
// count (docs/benchmarks.md, "Whole sessions"), and a longer segment
// chooses its anchors over more tokens.
constexpr int64_t kPromptSegmentUnits = 16;

struct StreamStep {
  bool finish = false;                      // commit the segment closing off the path
  std::vector<NewSegment> segs;             // to commit, in position order
  int64_t taken = 0;                        // tail ++ input tokens the segments take
  std::shared_ptr<ClosingSegment> started;  // compressing from now on
};

}  // namespace

int64_t close_lag(const AnchorKVConfig& cfg) { return std::min<int64_t>(32, cfg.segment_tokens); }

int64_t prompt_segment_tokens(const AnchorKVConfig& cfg) { return kPromptSegmentUnits * cfg.segment_tokens; }

namespace {

// Segments a call closes itself: a multi-token call every segment_tokens
// past the recent window, up to kPromptSegmentUnits of them in one segment; a
// decode step only the one it must (past the lag with none closing: a cache
// loaded from a file).
void close_now(const AnchorKVState& st, const cache::StagedInput& in, const CacheShape& shape,
               const std::shared_ptr<const compress::ResidualCodec>& codec, const WindowUpdate& window,
               bool busy, StreamStep& step) {
  const int64_t T = st.config.segment_tokens, rows = shape.rows(), D = shape.D, S = in.S();
  const int64_t keep = st.config.recent_tokens + (S > 1 ? 0 : close_lag(st.config));
  const int64_t n = st.tail.tokens + S - step.taken;
  const int64_t units = !busy && n - keep >= T ? (n - keep) / T : 0;
  if (units == 0) return;
  const cache::ObservationQueries queries = closing_queries(st, window);
  const int64_t most = S > 1 ? kPromptSegmentUnits : 1;
  core::UninitVector<float> K(static_cast<size_t>(rows * std::min(units, most) * T * D)), V(K.size());
  for (int64_t done = 0; done < units;) {
    const int64_t len = std::min(units - done, most) * T, pos0 = st.compressed_tokens() + step.taken;
    gather_stream(st, in, rows, D, step.taken, len, K.data(), V.data());
    const AnchorKVSegment* extend = segment_to_extend(st, step.segs, len);
    step.segs.push_back(
        compress_segment(st.config, *codec, shape, pos0, len, K.data(), V.data(), queries, true, extend));
    step.taken += len;
    done += len / T;
  }
}

// A decode step that fills a segment hands it to a background thread.
void start_if_full(const AnchorKVState& st, const cache::StagedInput& in, const CacheShape& shape,
                   const std::shared_ptr<const compress::ResidualCodec>& codec, const WindowUpdate& window,
                   StreamStep& step) {
  const int64_t T = st.config.segment_tokens, rows = shape.rows(), D = shape.D;
  if (st.tail.tokens + in.S() - step.taken < st.config.recent_tokens + T) return;
  auto inputs = std::make_shared<ClosingInputs>();
  inputs->cfg = st.config;
  inputs->cfg.threads = 1;  // beside decode, not in its pool (bits do not depend on threads)
  inputs->codec = codec;
  inputs->shape = shape;
  inputs->pos0 = st.compressed_tokens() + step.taken;
  inputs->tokens = T;
  inputs->kv.resize(static_cast<size_t>(2 * rows * T * D));
  gather_stream(st, in, rows, D, step.taken, T, inputs->kv.data(), inputs->kv.data() + rows * T * D);
  inputs->queries = closing_queries(st, window);
  if (const AnchorKVSegment* extend = segment_to_extend(st, step.segs, T)) {
    inputs->extend.emplace();  // its rows are all the compression reads
    inputs->extend->rows = extend->rows;
    inputs->extend->pos0 = extend->pos0;
    inputs->extend->tokens = extend->tokens;
  }
  step.started = start_closing(std::move(inputs));
}

}  // namespace

// Compute (segments, a started job, the query window, room for them), then
// commit: nothing after the tail's append can throw.
void store_streaming(AnchorKVState& st, const cache::StagedInput& in, const CacheShape& shape) {
  const int64_t T = st.config.segment_tokens, R = st.config.recent_tokens, S = in.S();
  WindowUpdate window = plan_window(st, in, shape.rows());
  auto codec = state_codec(st, shape.D);
  StreamStep step;
  step.finish = st.closing && (S > 1 || st.tail.tokens + S >= R + T + close_lag(st.config));
  if (step.finish) {
    step.segs.push_back(finish_closing(*st.closing, st));
    step.taken = T;
  }
  const bool busy = st.closing && !step.finish;
  close_now(st, in, shape, codec, window, busy, step);
  if (S == 1 && !busy) start_if_full(st, in, shape, codec, window, step);
  st.segments.reserve(st.segments.size() + step.segs.size());
  const int64_t from_tail = std::min(st.tail.tokens, step.taken);
  st.tail.append(in, step.taken - from_tail);
  st.tail.drop_front(from_tail, shape.D);
  commit_segments(st, std::move(step.segs), std::move(codec));
  if (step.finish) st.closing.reset();
  if (step.started) st.closing = std::move(step.started);
  commit_window(st, std::move(window));
}

void close_tail(AnchorKVState& st, const CacheShape& shape, const char* op) {
  const int64_t rows = shape.rows(), D = shape.D;
  auto codec = state_codec(st, D);
  std::vector<NewSegment> segs;
  int64_t taken = 0;
  if (st.closing) {
    segs.push_back(finish_closing(*st.closing, st));
    taken = st.closing->inputs->tokens;
  }
  const int64_t S = st.tail.tokens - taken;
  if (S == 0 && segs.empty()) core::fail(ErrorCode::kInvalidState, op, "the cache holds no exact token to compress");
  if (S > 0) {
    const core::UninitVector<float> kv = exact_f32(st.tail, rows, D, taken, st.tail.tokens, st.config.threads);
    const AnchorKVSegment* extend = segment_to_extend(st, segs, S);
    segs.push_back(compress_segment(st.config, *codec, shape, st.compressed_tokens() + taken, S, kv.data(),
                                    kv.data() + rows * S * D, st.recent_queries.ordered(), true, extend));
  }
  st.segments.reserve(st.segments.size() + segs.size());
  st.tail.drop_front(st.tail.tokens, D);
  commit_segments(st, std::move(segs), std::move(codec));
  st.closing.reset();
}

}  // namespace anchorkv::internal
