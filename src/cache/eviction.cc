// The eviction baselines: StreamingLLM, SnapKV and H2O keep a subset of the
// prefill as exact fp16 rows (EvictionStore); they differ in which positions
// they keep and in what decode does.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "anchorkv/baselines.h"
#include "cache/core.h"
#include "compress/utility.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/linalg.h"
#include "core/parallel.h"
#include "core/softmax.h"

namespace anchorkv {
namespace {

using internal::CacheShape;

double checked_theta(double theta, const char* op) {
  if (!std::isfinite(theta) || theta < 0.0 || theta > 1.0)
    core::fail(ErrorCode::kInvalidConfig, op, "invalid theta: must be in [0, 1], got " + std::to_string(theta));
  return theta;
}

// Kept tokens of every row as exact fp16; the first call with S > 1 is the
// prefill, which chooses what to keep; later calls go through decode().
class EvictionStore : public internal::CacheStore {
 public:
  void store(const cache::StagedInput& in, const CacheShape& shape) final {
    if (!selected_ && in.S() > 1) {
      prefill(in, shape);
      selected_ = true;
      capacity_ = kept_.tokens;
    } else {
      decode(in, shape);
    }
  }
  KVPair fetch(const CacheShape& s) const override { return kept_.to_pair(s.B, s.H, s.D); }
  int64_t nbytes(const CacheShape&) const override { return kept_.buffer_bytes(); }
  int64_t kept_per_row(const CacheShape&) const override { return kept_.tokens; }
  void save_state(cache::ByteWriter& w, const CacheShape&) const override {
    w.put<uint8_t>(selected_);
    w.put<int64_t>(capacity_);
    cache::save_rows(w, kept_);
  }
  void load_state(cache::ByteReader& r, const CacheShape& s) override {
    const bool selected = r.flag("selected");
    const int64_t capacity = r.get<int64_t>("capacity");
    cache::ExactRows kept = cache::load_rows(r, s.rows(), s.D, "kept");
    if (capacity < 0 || capacity > s.seen || kept.tokens > s.seen)
      r.fail("capacity", "kept tokens and capacity must fit the tokens seen");
    selected_ = selected;
    capacity_ = capacity;
    kept_ = std::move(kept);
  }
  // Positions are the kept tokens' order: a decode query sees them all.
  cache::AttentionSource attention_source(const CacheShape& s) const override {
    cache::AttentionSource src{s.B, s.H, s.D, kept_.tokens};
    if (kept_.tokens > 0) src.dense_after.push_back(cache::dense_region(kept_, 0));
    return src;
  }

 protected:
  explicit EvictionStore(double theta) : theta_(theta) {}
  // Token budget for a prefill of S tokens: max(1, floor(theta * S)).
  int64_t budget_tokens(int64_t S) const {
    return std::clamp<int64_t>(static_cast<int64_t>(std::floor(theta_ * static_cast<double>(S))), 1, S);
  }
  // Keeps select()'s positions of each row after anything stored before.
  virtual void prefill(const cache::StagedInput& in, const CacheShape& shape);
  // Appends (StreamingLLM also evicts to stay at capacity).
  virtual void decode(const cache::StagedInput& in, const CacheShape&) { kept_.append(in); }
  // Positions (ascending, within [0, S)) to keep from prefill row `r`.
  virtual std::vector<int32_t> select(const cache::StagedInput& in, int64_t r, int64_t budget) const = 0;

  double theta_;
  bool selected_ = false;
  int64_t capacity_ = 0;    // kept tokens per row after the prefill
  cache::ExactRows kept_;   // rows x [kept, D] fp16
};

void EvictionStore::prefill(const cache::StagedInput& in, const CacheShape& shape) {
  const int64_t S = in.S(), D = shape.D, R = shape.rows(), budget = budget_tokens(S);
  std::vector<std::vector<int32_t>> keep(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) keep[r] = select(in, r, budget);
  cache::ExactRows rows = kept_;  // only tokens stored before the prefill: small
  rows.resize_rows(R);
  for (int64_t r = 0; r < R; ++r) {
    const size_t at = rows.k[r].size();
    rows.k[r].resize(at + keep[r].size() * static_cast<size_t>(D));
    rows.v[r].resize(rows.k[r].size());
    for (size_t i = 0; i < keep[r].size(); ++i) {
      core::f32_to_f16_n(in.key_row(r) + keep[r][i] * D, &rows.k[r][at + i * D], D);
      core::f32_to_f16_n(in.value_row(r) + keep[r][i] * D, &rows.v[r][at + i * D], D);
    }
  }
  rows.tokens += static_cast<int64_t>(keep[0].size());
  kept_ = std::move(rows);
}

// ============================================================== StreamingLLM

class StreamingLLMStore final : public EvictionStore {
 public:
  StreamingLLMStore(double theta, int64_t sinks) : EvictionStore(theta), sinks_(sinks) {}
  std::string name() const override { return "streamingllm"; }
  const char* api_name() const override { return "anchorkv::StreamingLLMCache"; }
  void save_config(cache::ByteWriter& w) const override {
    w.put<double>(theta_);
    w.put<int64_t>(sinks_);
  }

 private:
  std::vector<int32_t> select(const cache::StagedInput& in, int64_t, int64_t budget) const override {
    const int64_t S = in.S(), sk = std::min(sinks_, budget);
    std::vector<int32_t> keep;
    for (int64_t t = 0; t < sk; ++t) keep.push_back(static_cast<int32_t>(t));
    for (int64_t t = std::max(sk, S - (budget - sk)); t < S; ++t) keep.push_back(static_cast<int32_t>(t));
    return keep;
  }
  // Rolling: over capacity, the oldest tokens after the sinks leave.
  void decode(const cache::StagedInput& in, const CacheShape& shape) override {
    kept_.append(in);
    if (!selected_ || kept_.tokens <= capacity_) return;
    const int64_t excess = kept_.tokens - capacity_, sk = std::min(sinks_, capacity_), D = shape.D;
    for (int64_t r = 0; r < shape.rows(); ++r) {
      kept_.k[r].erase(kept_.k[r].begin() + sk * D, kept_.k[r].begin() + (sk + excess) * D);
      kept_.v[r].erase(kept_.v[r].begin() + sk * D, kept_.v[r].begin() + (sk + excess) * D);
    }
    kept_.tokens = capacity_;
  }
  int64_t sinks_;
};

// ============================================================== SnapKV

class SnapKVStore final : public EvictionStore {
 public:
  SnapKVStore(double theta, int64_t window, int64_t kernel)
      : EvictionStore(theta), window_(window), kernel_(kernel) {}
  std::string name() const override { return "snapkv"; }
  const char* api_name() const override { return "anchorkv::SnapKVCache"; }
  void save_config(cache::ByteWriter& w) const override {
    w.put<double>(theta_);
    w.put<int64_t>(window_);
    w.put<int64_t>(kernel_);
  }

 private:
  std::vector<int32_t> select(const cache::StagedInput& in, int64_t r, int64_t budget) const override;
  int64_t window_, kernel_;
};

std::vector<int32_t> SnapKVStore::select(const cache::StagedInput& in, int64_t r, int64_t budget) const {
  const int64_t S = in.S(), D = in.D();
  const float* K = in.key_row(r);
  const int64_t w = std::min({window_, budget, S});
  const int64_t n_cand = S - w;
  // Observation-window attention summed over the observers: the real queries
  // of the last positions (causal) when given, else the trailing w keys.
  const compress::Observers o = in.queries.empty()
                                    ? compress::proxy_observers(K, S, D, w)
                                    : compress::query_observers(in.queries.row(r), in.queries.G, in.queries.W);
  std::vector<float> logits(static_cast<size_t>(o.m * S));
  core::dot_matrix(o.rows, o.m, D, K, S, D, D, logits.data(), S);
  const float inv = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<double> score(static_cast<size_t>(S), 0.0);
  for (int64_t i = 0; i < o.m; ++i) {
    float* row = &logits[static_cast<size_t>(i * S)];
    const int64_t n = o.visible(i, S);
    for (int64_t t = 0; t < n; ++t) row[t] *= inv;
    core::softmax_inplace(row, n);
    for (int64_t t = 0; t < n; ++t) score[t] += row[t];
  }
  // Average pooling of width kernel over the candidates (window of valid neighbours).
  const int64_t half = kernel_ / 2;
  std::vector<double> pooled(static_cast<size_t>(n_cand));
  for (int64_t t = 0; t < n_cand; ++t) {
    const int64_t a = std::max<int64_t>(0, t - half), b = std::min(n_cand - 1, t + half);
    double sum = 0;
    for (int64_t j = a; j <= b; ++j) sum += score[j];
    pooled[t] = sum / static_cast<double>(b - a + 1);
  }
  std::vector<int32_t> cand(static_cast<size_t>(n_cand));
  std::iota(cand.begin(), cand.end(), 0);
  const int64_t top = std::min(budget - w, n_cand);
  std::partial_sort(cand.begin(), cand.begin() + top, cand.end(), [&](int32_t a, int32_t b) {
    return pooled[a] != pooled[b] ? pooled[a] > pooled[b] : a < b;
  });
  std::vector<int32_t> keep(cand.begin(), cand.begin() + top);
  for (int64_t t = n_cand; t < S; ++t) keep.push_back(static_cast<int32_t>(t));
  std::sort(keep.begin(), keep.end());
  return keep;
}

// ============================================================== H2O

class H2OStore final : public EvictionStore {
 public:
  H2OStore(double theta, double recent_share) : EvictionStore(theta), recent_share_(recent_share) {}
  std::string name() const override { return "h2o"; }
  const char* api_name() const override { return "anchorkv::H2OCache"; }
  void save_config(cache::ByteWriter& w) const override {
    w.put<double>(theta_);
    w.put<double>(recent_share_);
  }
  void save_state(cache::ByteWriter& w, const CacheShape& s) const override {
    EvictionStore::save_state(w, s);
    w.put<uint64_t>(score_.size());
    for (const auto& sc : score_) w.array(sc);
  }
  void load_state(cache::ByteReader& r, const CacheShape& s) override {
    H2OStore h(theta_, recent_share_);
    h.EvictionStore::load_state(r, s);
    const uint64_t R = r.get<uint64_t>("scores");
    if (R != 0 && R != static_cast<uint64_t>(s.rows())) r.fail("scores", "wrong number of rows");
    if (R == 0 && h.kept_.tokens > 0) r.fail("scores", "no scores for the kept tokens");
    for (uint64_t i = 0; i < R; ++i) h.score_.push_back(r.floats("scores", static_cast<uint64_t>(h.kept_.tokens)));
    *this = std::move(h);
  }
  int64_t nbytes(const CacheShape&) const override {
    int64_t n = kept_.buffer_bytes();
    for (const auto& sc : score_) n += static_cast<int64_t>(sc.size() * sizeof(float));
    return n;
  }

 private:
  std::vector<int32_t> select(const cache::StagedInput&, int64_t, int64_t) const override { return {}; }
  void prefill(const cache::StagedInput& in, const CacheShape& shape) override;
  void decode(const cache::StagedInput& in, const CacheShape& shape) override;
  int64_t recent_tokens(int64_t T) const {
    return std::min<int64_t>(T, static_cast<int64_t>(std::llround(recent_share_ * static_cast<double>(T))));
  }
  double recent_share_;
  std::vector<std::vector<float>> score_;  // rows x [kept] accumulated attention
};

// The queries of position t of the call's row r, each with its weight: the G
// real queries (1/G each) where the call gave queries for t, else the key.
std::vector<std::pair<const float*, double>> position_queries(const cache::StagedInput& in, int64_t r, int64_t t) {
  const cache::ObservationQueries& q = in.queries;
  const int64_t first = in.S() - q.W;
  if (q.empty() || t < first) return {{in.key_row(r) + t * in.D(), 1.0}};
  std::vector<std::pair<const float*, double>> out;
  for (int64_t g = 0; g < q.G; ++g)
    out.emplace_back(q.row(r) + (g * q.W + t - first) * q.D, 1.0 / static_cast<double>(q.G));
  return out;
}

void H2OStore::prefill(const cache::StagedInput& in, const CacheShape& shape) {
  const int64_t S = in.S(), D = shape.D, R = shape.rows();
  const float inv = 1.0f / std::sqrt(static_cast<float>(D));
  // Budget in tokens, the stored score (4 bytes) counted: T * (4 D + 4) <= theta * S * 4 D.
  const int64_t T = std::clamp<int64_t>(
      static_cast<int64_t>(std::floor(theta_ * static_cast<double>(S) * 4.0 * D / (4.0 * D + 4.0))), 1, S);
  const int64_t n_recent = recent_tokens(T);
  cache::ExactRows rows;
  rows.resize_rows(R);
  std::vector<std::vector<float>> scores(static_cast<size_t>(R));
  core::parallel_for(R, 0, [&](int64_t r) {  // rows are independent: same result for any thread count
    std::vector<float> row(static_cast<size_t>(S));
    const float* K = in.key_row(r);
    // Accumulated causal attention received: from each position's real
    // queries (mean over the GQA group) where the call gave them, else from
    // its key acting as a query.
    std::vector<double> acc(static_cast<size_t>(S), 0.0);
    for (int64_t i = 0; i < S; ++i)
      for (const auto& [q, weight] : position_queries(in, r, i)) {
        core::dot_matrix(q, 1, D, K, i + 1, D, D, row.data(), i + 1);
        for (int64_t t = 0; t <= i; ++t) row[t] *= inv;
        core::softmax_inplace(row.data(), i + 1);
        for (int64_t t = 0; t <= i; ++t) acc[t] += weight * row[t];
      }
    std::vector<int32_t> cand(static_cast<size_t>(S - n_recent));
    std::iota(cand.begin(), cand.end(), 0);
    const int64_t heavy = std::min<int64_t>(T - n_recent, static_cast<int64_t>(cand.size()));
    std::partial_sort(cand.begin(), cand.begin() + heavy, cand.end(),
                      [&](int32_t a, int32_t b) { return acc[a] != acc[b] ? acc[a] > acc[b] : a < b; });
    std::vector<int32_t> keep(cand.begin(), cand.begin() + heavy);
    for (int64_t t = S - n_recent; t < S; ++t) keep.push_back(static_cast<int32_t>(t));
    std::sort(keep.begin(), keep.end());
    rows.k[r].resize(keep.size() * static_cast<size_t>(D));
    rows.v[r].resize(rows.k[r].size());
    for (size_t i = 0; i < keep.size(); ++i) {
      core::f32_to_f16_n(K + keep[i] * D, &rows.k[r][i * D], D);
      core::f32_to_f16_n(in.value_row(r) + keep[i] * D, &rows.v[r][i * D], D);
      scores[r].push_back(static_cast<float>(acc[keep[i]]));
    }
  });
  rows.tokens = T;
  kept_ = std::move(rows);
  score_ = std::move(scores);
}

// Each new key attends over what is kept (and the new keys before it) and adds
// to the scores; over capacity, the lowest scorer outside the recent window
// leaves. New scores are computed aside first, so a throw changes nothing.
void H2OStore::decode(const cache::StagedInput& in, const CacheShape& shape) {
  const int64_t S = in.S(), D = shape.D, R = shape.rows(), n0 = kept_.tokens;
  const float inv = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<std::vector<float>> scores(static_cast<size_t>(R));
  std::vector<float> keys(static_cast<size_t>((n0 + S) * D)), logit(static_cast<size_t>(n0 + S));
  for (int64_t r = 0; r < R; ++r) {
    if (n0 > 0) core::f16_to_f32_n(kept_.k[r].data(), keys.data(), n0 * D);
    std::copy_n(in.key_row(r), S * D, keys.data() + n0 * D);  // staged keys are fp16-rounded already
    scores[r] = r < static_cast<int64_t>(score_.size()) ? score_[r] : std::vector<float>();
    scores[r].resize(static_cast<size_t>(n0 + S), 0.0f);
    for (int64_t t = 0; t < S; ++t) {
      const int64_t n = n0 + t + 1;  // tokens visible to new token t
      for (const auto& [q, weight] : position_queries(in, r, t)) {
        core::dot_matrix(q, 1, D, keys.data(), n, D, D, logit.data(), n);
        for (int64_t i = 0; i < n; ++i) logit[i] *= inv;
        core::softmax_inplace(logit.data(), n);
        for (int64_t i = 0; i < n; ++i) scores[r][i] += static_cast<float>(weight * logit[i]);
      }
    }
  }
  kept_.append(in);  // strong guarantee on its own; nothing below throws
  score_ = std::move(scores);
  if (!selected_) return;
  const int64_t n_recent = recent_tokens(capacity_);
  while (kept_.tokens > capacity_) {
    const int64_t limit = kept_.tokens - n_recent;  // candidates [0, limit)
    for (int64_t r = 0; r < R; ++r) {
      int64_t worst = 0;
      for (int64_t i = 1; i < limit; ++i)
        if (score_[r][i] < score_[r][worst]) worst = i;
      kept_.k[r].erase(kept_.k[r].begin() + worst * D, kept_.k[r].begin() + (worst + 1) * D);
      kept_.v[r].erase(kept_.v[r].begin() + worst * D, kept_.v[r].begin() + (worst + 1) * D);
      score_[r].erase(score_[r].begin() + worst);
    }
    --kept_.tokens;
  }
}

}  // namespace

std::unique_ptr<KVCache> internal::streamingllm_cache_from_config(cache::ByteReader& r) {
  const double theta = r.get<double>("config.theta");
  const int64_t sinks = r.get<int64_t>("config.sinks");
  return internal::rebuild(r, "config", [&] { return std::make_unique<StreamingLLMCache>(theta, sinks); });
}

std::unique_ptr<KVCache> internal::snapkv_cache_from_config(cache::ByteReader& r) {
  const double theta = r.get<double>("config.theta");
  const int64_t window = r.get<int64_t>("config.window");
  const int64_t kernel = r.get<int64_t>("config.kernel");
  return internal::rebuild(r, "config", [&] { return std::make_unique<SnapKVCache>(theta, window, kernel); });
}

std::unique_ptr<KVCache> internal::h2o_cache_from_config(cache::ByteReader& r) {
  const double theta = r.get<double>("config.theta");
  const double recent_share = r.get<double>("config.recent_share");
  return internal::rebuild(r, "config", [&] { return std::make_unique<H2OCache>(theta, recent_share); });
}

StreamingLLMCache::StreamingLLMCache(double theta, int64_t sinks)
    : KVCache([&] {
        constexpr const char* op = "anchorkv::StreamingLLMCache";
        checked_theta(theta, op);
        if (sinks < 0) core::fail(ErrorCode::kInvalidConfig, op, "invalid sinks: must be >= 0");
        return std::make_unique<StreamingLLMStore>(theta, sinks);
      }()) {}

SnapKVCache::SnapKVCache(double theta, int64_t window, int64_t kernel)
    : KVCache([&] {
        constexpr const char* op = "anchorkv::SnapKVCache";
        checked_theta(theta, op);
        if (window < 1) core::fail(ErrorCode::kInvalidConfig, op, "invalid window: must be >= 1");
        if (kernel < 1 || kernel % 2 == 0)
          core::fail(ErrorCode::kInvalidConfig, op, "invalid kernel: must be odd and >= 1");
        return std::make_unique<SnapKVStore>(theta, window, kernel);
      }()) {}

H2OCache::H2OCache(double theta, double recent_share)
    : KVCache([&] {
        constexpr const char* op = "anchorkv::H2OCache";
        checked_theta(theta, op);
        if (!std::isfinite(recent_share) || recent_share < 0.0 || recent_share > 1.0)
          core::fail(ErrorCode::kInvalidConfig, op, "invalid recent_share: must be in [0, 1]");
        return std::make_unique<H2OStore>(theta, recent_share);
      }()) {}

}  // namespace anchorkv
