// Validation and staging of update_and_fetch inputs, shared by every cache.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "anchorkv/cache.h"
#include "anchorkv/tensor.h"
#include "core/buffer.h"

namespace anchorkv::cache {

// Real queries of a call's last W positions (the observation window), as
// contiguous f32 [B, Hq, W, D] with Hq = G * H: row r = b * H + h holds its
// GQA group's G query heads, [G, W, D], contiguous. Empty when none were given.
struct ObservationQueries {
  int64_t G = 0, W = 0, D = 0;
  core::UninitVector<float> q;
  bool empty() const { return q.empty(); }
  const float* row(int64_t r) const { return q.data() + r * G * W * D; }
};

// K and V of one call, validated, as contiguous [B, H, S, D] f32 holding the
// fp16-rounded values (what fp16 storage keeps).
struct StagedInput {
  Shape4 shape{0, 0, 0, 0};
  core::UninitVector<float> k, v;
  ObservationQueries queries;  // optional
  int64_t B() const { return shape[0]; }
  int64_t H() const { return shape[1]; }
  int64_t S() const { return shape[2]; }
  int64_t D() const { return shape[3]; }
  const float* key_row(int64_t row) const { return k.data() + row * S() * D(); }
  const float* value_row(int64_t row) const { return v.data() + row * S() * D(); }
};

// Checks shapes (equal K/V shapes, B, H, D >= 1, S >= 0, non-null data,
// non-negative strides), that B, H, D equal `expected` when has_expected, and
// that every value is finite with |x| <= 65504. Throws anchorkv::Error naming
// `op`; never modifies anything.
StagedInput stage_input(std::string_view op, const TensorView& keys, const TensorView& values,
                        bool has_expected, int64_t expected_B, int64_t expected_H, int64_t expected_D);

// Checks `queries` against the staged call `in` (B and D equal, Hq a multiple
// of H, 1 <= W <= S, every value finite) and stores them in in.queries. Throws
// anchorkv::Error naming `op`; `in` is unchanged on a throw.
void stage_queries(std::string_view op, const TensorView& queries, StagedInput& in);

// Per-row exact fp16 storage: rows x [n, D].
struct ExactRows {
  std::vector<std::vector<uint16_t>> k, v;
  int64_t tokens = 0;  // per row

  void resize_rows(int64_t rows) {
    k.resize(static_cast<size_t>(rows));
    v.resize(static_cast<size_t>(rows));
  }
  // Reserves room for `in`'s positions [from, S) (may throw), then appends
  // them (cannot throw).
  void append(const StagedInput& in, int64_t from = 0);
  // Removes each row's first n positions (n <= tokens); keeps the capacity.
  void drop_front(int64_t n, int64_t D) noexcept;
  void clear();
  int64_t buffer_bytes() const;
  // The rows as dense fp16 K/V [B, H, tokens, D] (rows = B * H; empty rows allowed when B*H == 0).
  KVPair to_pair(int64_t B, int64_t H, int64_t D) const;
};

class ByteWriter;
class ByteReader;
// ExactRows in the cache-file format: u64 tokens, then per row K and V arrays.
void save_rows(ByteWriter& w, const ExactRows& rows);
// Reads rows x [tokens, D] (every size checked against rows and D).
ExactRows load_rows(ByteReader& r, int64_t rows, int64_t D, const char* field);

}  // namespace anchorkv::cache
