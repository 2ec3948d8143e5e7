// SlidingWindowKVCache: a ring of the last `window` positions per row, exact
// fp16. Until it is full it grows in position order; once full, each new
// position overwrites the oldest, so a decode step costs one token's copy and
// the bytes held are exactly the kept tokens'.
#include <algorithm>
#include <string>
#include <tuple>

#include "anchorkv/cache.h"
#include "cache/core.h"
#include "core/convert.h"
#include "core/error.h"

namespace anchorkv {
namespace {

constexpr int64_t kMaxWindow = int64_t{1} << 30;

class WindowStore final : public internal::CacheStore {
 public:
  explicit WindowStore(int64_t window) : window_(window) {}
  std::string name() const override { return "window"; }
  const char* api_name() const override { return "anchorkv::SlidingWindowKVCache"; }
  bool takes_prompt_in_calls() const override { return true; }
  int64_t sliding_window() const override { return window_; }

  void store(const cache::StagedInput& in, const internal::CacheShape& s) override {
    const int64_t R = s.rows(), D = s.D, S = in.S(), first = std::max<int64_t>(0, S - window_);
    const int64_t grown = std::min(window_, count_ + (S - first));
    // Room first (may throw; nothing changed yet), then the copies.
    if (static_cast<int64_t>(k_.size()) != R) {
      k_.resize(static_cast<size_t>(R));
      v_.resize(static_cast<size_t>(R));
    }
    for (int64_t r = 0; r < R; ++r)
      if (static_cast<int64_t>(k_[r].size()) < grown * D) {
        k_[r].reserve(static_cast<size_t>(grown * D));
        v_[r].reserve(static_cast<size_t>(grown * D));
      }
    for (int64_t t = first; t < S; ++t) {
      const int64_t slot = count_ < window_ ? (start_ + count_) % window_ : start_;
      for (int64_t r = 0; r < R; ++r) {
        if (slot * D == static_cast<int64_t>(k_[r].size())) {  // still growing
          k_[r].resize(static_cast<size_t>((slot + 1) * D));
          v_[r].resize(k_[r].size());
        }
        core::f32_to_f16_n(in.key_row(r) + t * D, &k_[r][static_cast<size_t>(slot * D)], D);
        core::f32_to_f16_n(in.value_row(r) + t * D, &v_[r][static_cast<size_t>(slot * D)], D);
      }
      if (count_ < window_)
        ++count_;
      else
        start_ = (start_ + 1) % window_;
    }
  }

  KVPair fetch(const internal::CacheShape& s) const override { return ordered(s.D).to_pair(s.B, s.H, s.D); }
  int64_t nbytes(const internal::CacheShape& s) const override { return count_ * s.rows() * s.D * 4; }
  int64_t kept_per_row(const internal::CacheShape&) const override { return count_; }

  // The ring in position order: from the oldest slot to the end, then the wrapped part.
  cache::AttentionSource attention_source(const internal::CacheShape& s) const override {
    cache::AttentionSource src{s.B, s.H, s.D, count_};
    const int64_t first = std::min(count_, window_ - start_), rest = count_ - first;
    for (auto [from, n, pos0] : {std::tuple{start_, first, int64_t{0}}, std::tuple{int64_t{0}, rest, first}}) {
      if (n == 0) continue;
      cache::DenseRegion d;
      d.n = n;
      d.pos0 = pos0;
      for (int64_t r = 0; r < s.rows(); ++r) {
        d.k.push_back(k_[r].data() + from * s.D);
        d.v.push_back(v_[r].data() + from * s.D);
      }
      src.dense_after.push_back(std::move(d));
    }
    return src;
  }

  void save_config(cache::ByteWriter& w) const override { w.put<int64_t>(window_); }
  void save_state(cache::ByteWriter& w, const internal::CacheShape& s) const override {
    cache::save_rows(w, ordered(s.D));
  }
  void load_state(cache::ByteReader& r, const internal::CacheShape& s) override {
    cache::ExactRows rows = cache::load_rows(r, s.rows(), s.D, "rows");
    if (rows.tokens != std::min(s.seen, window_))
      r.fail("rows", "holds " + std::to_string(rows.tokens) + " tokens; the window keeps " +
                         std::to_string(std::min(s.seen, window_)) + " of the " + std::to_string(s.seen) + " seen");
    k_ = std::move(rows.k);
    v_ = std::move(rows.v);
    count_ = rows.tokens;
    start_ = 0;
  }

 private:
  cache::ExactRows ordered(int64_t D) const {
    cache::ExactRows out;
    out.resize_rows(static_cast<int64_t>(k_.size()));
    out.tokens = count_;
    for (size_t r = 0; r < k_.size(); ++r)
      for (int64_t i = 0; i < count_; ++i) {
        const auto at = static_cast<std::ptrdiff_t>(((start_ + i) % window_) * D);
        out.k[r].insert(out.k[r].end(), k_[r].begin() + at, k_[r].begin() + at + D);
        out.v[r].insert(out.v[r].end(), v_[r].begin() + at, v_[r].begin() + at + D);
      }
    return out;
  }

  int64_t window_;
  std::vector<std::vector<uint16_t>> k_, v_;  // rows x [min(seen, window), D]
  int64_t start_ = 0, count_ = 0;             // the oldest slot, the positions held
};

int64_t checked_window(int64_t w) {
  if (w < 1 || w > kMaxWindow)
    core::fail(ErrorCode::kInvalidConfig, "anchorkv::SlidingWindowKVCache",
               "window must be in [1, 2^30], got " + std::to_string(w));
  return w;
}

}  // namespace

SlidingWindowKVCache::SlidingWindowKVCache(int64_t window)
    : KVCache(std::make_unique<WindowStore>(checked_window(window))), window_(window) {}

std::unique_ptr<KVCache> internal::window_cache_from_config(cache::ByteReader& r) {
  const int64_t window = r.get<int64_t>("config.window");
  return internal::rebuild(r, "config.window", [&] { return std::make_unique<SlidingWindowKVCache>(window); });
}

}  // namespace anchorkv
