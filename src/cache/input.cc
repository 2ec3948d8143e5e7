#include "cache/input.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cache/serial.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/half.h"

namespace anchorkv::cache {
namespace {

void check_view(std::string_view op, const char* name, const TensorView& t) {
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 0)
      core::fail(ErrorCode::kInvalidArgument, op,
                 std::string(name) + " has a negative dimension: " + shape_string(t.shape));
    if (t.strides[i] < 0)
      core::fail(ErrorCode::kInvalidArgument, op, std::string(name) + " has a negative stride");
  }
  if (t.shape[0] < 1 || t.shape[1] < 1)
    core::fail(ErrorCode::kInvalidArgument, op,
               std::string(name) + " needs B >= 1 and H >= 1, got " + shape_string(t.shape));
  if (t.shape[3] < 1)
    core::fail(ErrorCode::kInvalidArgument, op,
               std::string(name) + " has head dim D = 0: " + shape_string(t.shape));
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16)
    core::fail(ErrorCode::kInvalidArgument, op, std::string(name) + " has an unknown dtype");
  if (t.numel() > 0 && t.data == nullptr)
    core::fail(ErrorCode::kInvalidArgument, op, std::string(name) + " has null data");
}

std::string index_string(const Shape4& s, int64_t flat) {
  const int64_t d = flat % s[3], p = flat / s[3] % s[2], h = flat / (s[3] * s[2]) % s[1],
                b = flat / (s[3] * s[2] * s[1]);
  std::string out = "[";  // appended piece by piece: GCC 12 warns (-Wrestrict) on "[" + std::string
  const int64_t at[4] = {b, h, p, d};
  for (int i = 0; i < 4; ++i) (out += std::to_string(at[i])) += i == 3 ? "]" : ", ";
  return out;
}

[[noreturn]] void reject_value(std::string_view op, const char* name, const Shape4& shape, int64_t flat,
                               float x) {
  if (!std::isfinite(x))
    core::fail(ErrorCode::kNonFinite, op,
               std::string(name) + " holds a non-finite value (" + std::to_string(x) + ") at " +
                   index_string(shape, flat));
  core::fail(ErrorCode::kOutOfRange, op,
             std::string(name) + " value " + std::to_string(x) + " at " + index_string(shape, flat) +
                 " is beyond the fp16 range (|x| <= 65504)");
}

// Reads the view into `out` (contiguous f32), checks every value, rounds to fp16 precision.
void convert(std::string_view op, const char* name, const TensorView& t, core::UninitVector<float>& out) {
  const auto& s = t.shape;
  const int64_t n = t.numel();
  out.resize(static_cast<size_t>(n));
  if (t.is_contiguous() && t.dtype == DType::kF32) {
    const float* in = static_cast<const float*>(t.data);
    const int64_t bad = core::find_outside_fp16(in, n);
    if (bad >= 0) reject_value(op, name, s, bad, in[bad]);
    core::round_to_f16_n(in, out.data(), n);
    return;
  }
  if (t.is_contiguous() && t.dtype == DType::kF16) {
    core::f16_to_f32_n(static_cast<const uint16_t*>(t.data), out.data(), n);
  } else {
    int64_t i = 0;
    for (int64_t b = 0; b < s[0]; ++b)
      for (int64_t h = 0; h < s[1]; ++h)
        for (int64_t p = 0; p < s[2]; ++p)
          for (int64_t d = 0; d < s[3]; ++d) out[static_cast<size_t>(i++)] = t.at(b, h, p, d);
  }
  const int64_t bad = core::find_outside_fp16(out.data(), n);
  if (bad >= 0) reject_value(op, name, s, bad, out[static_cast<size_t>(bad)]);
  core::round_to_f16_n(out.data(), out.data(), n);
}

}  // namespace

StagedInput stage_input(std::string_view op, const TensorView& keys, const TensorView& values,
                        bool has_expected, int64_t expected_B, int64_t expected_H, int64_t expected_D) {
  check_view(op, "keys", keys);
  check_view(op, "values", values);
  if (keys.shape != values.shape)
    core::fail(ErrorCode::kShapeMismatch, op,
               "keys and values differ: keys " + shape_string(keys.shape) + " vs values " +
                   shape_string(values.shape));
  if (has_expected &&
      (keys.shape[0] != expected_B || keys.shape[1] != expected_H || keys.shape[3] != expected_D))
    core::fail(ErrorCode::kShapeMismatch, op,
               "shape " + shape_string(keys.shape) + " does not match the cache's B=" +
                   std::to_string(expected_B) + ", H=" + std::to_string(expected_H) +
                   ", D=" + std::to_string(expected_D) + " from earlier calls");
  StagedInput in;
  in.shape = keys.shape;
  convert(op, "keys", keys, in.k);
  convert(op, "values", values, in.v);
  return in;
}

void stage_queries(std::string_view op, const TensorView& queries, StagedInput& in) {
  check_view(op, "queries", queries);
  const Shape4& s = queries.shape;
  if (s[0] != in.B() || s[3] != in.D() || s[1] % in.H() != 0)
    core::fail(ErrorCode::kShapeMismatch, op,
               "queries " + shape_string(s) + " do not fit keys " + shape_string(in.shape) +
                   ": need the same B and D and a multiple of H query heads");
  if (s[2] < 1 || s[2] > in.S())
    core::fail(ErrorCode::kShapeMismatch, op,
               "queries cover " + std::to_string(s[2]) + " positions; the call adds " + std::to_string(in.S()) +
                   " (need 1 <= W <= S: the queries of the call's last W positions)");
  ObservationQueries q;
  q.G = s[1] / in.H();
  q.W = s[2];
  q.D = s[3];
  const int64_t n = queries.numel();
  q.q.resize(static_cast<size_t>(n));
  if (queries.is_contiguous() && queries.dtype == DType::kF32) {
    std::copy_n(static_cast<const float*>(queries.data), n, q.q.data());
  } else {
    int64_t i = 0;
    for (int64_t b = 0; b < s[0]; ++b)
      for (int64_t h = 0; h < s[1]; ++h)
        for (int64_t p = 0; p < s[2]; ++p)
          for (int64_t d = 0; d < s[3]; ++d) q.q[static_cast<size_t>(i++)] = queries.at(b, h, p, d);
  }
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(q.q[static_cast<size_t>(i)]))
      core::fail(ErrorCode::kNonFinite, op,
                 "queries hold a non-finite value (" + std::to_string(q.q[static_cast<size_t>(i)]) + ") at " +
                     index_string(s, i));
  in.queries = std::move(q);
}

void ExactRows::append(const StagedInput& in, int64_t from) {
  const int64_t rows = in.B() * in.H(), D = in.D();
  const size_t n = static_cast<size_t>((in.S() - from) * D);
  resize_rows(rows);
  // Capacity grows geometrically, by an eighth of what the rows then hold:
  // reserving exactly size + n reallocated (and copied) every row on every
  // decode step, O(S) per token; doubling would leave up to half of a long
  // context's buffer unused. The eighth is reserved by the call that needs
  // room, a prompt included, so the decode steps after a prompt append in
  // place (sized exactly, the first of them copied every row: 9 of the full
  // cache's 14 ms first step after a 32768-token prompt, 4 layers).
  // Reserving first keeps the strong guarantee: nothing below can throw.
  auto grow = [n](std::vector<uint16_t>& x) {
    const size_t need = x.size() + n;
    if (x.capacity() < need) x.reserve(std::max(need + need / 8, size_t{4096}));
  };
  for (int64_t r = 0; r < rows; ++r) {
    grow(k[r]);
    grow(v[r]);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const size_t at = k[r].size();
    k[r].resize(at + n);  // within capacity: cannot throw
    v[r].resize(at + n);
    core::f32_to_f16_n(in.key_row(r) + from * D, k[r].data() + at, static_cast<int64_t>(n));
    core::f32_to_f16_n(in.value_row(r) + from * D, v[r].data() + at, static_cast<int64_t>(n));
  }
  tokens += in.S() - from;
}

void ExactRows::drop_front(int64_t n, int64_t D) noexcept {
  if (n <= 0) return;
  const auto cut = static_cast<std::ptrdiff_t>(n * D);
  for (auto* side : {&k, &v})
    for (auto& x : *side) x.erase(x.begin(), x.begin() + cut);
  tokens -= n;
}

void ExactRows::clear() {
  for (auto& x : k) std::vector<uint16_t>().swap(x);
  for (auto& x : v) std::vector<uint16_t>().swap(x);
  tokens = 0;
}

KVPair ExactRows::to_pair(int64_t B, int64_t H, int64_t D) const {
  const int64_t n = tokens;
  KVPair out{Tensor(DType::kF16, {B, H, n, D}), Tensor(DType::kF16, {B, H, n, D})};
  for (int64_t r = 0; r < B * H; ++r) {
    std::copy(k[r].begin(), k[r].end(), out.keys.data_as<uint16_t>() + r * n * D);
    std::copy(v[r].begin(), v[r].end(), out.values.data_as<uint16_t>() + r * n * D);
  }
  return out;
}

int64_t ExactRows::buffer_bytes() const {
  int64_t n = 0;
  for (const auto& x : k) n += static_cast<int64_t>(x.size() * sizeof(uint16_t));
  for (const auto& x : v) n += static_cast<int64_t>(x.size() * sizeof(uint16_t));
  return n;
}

void save_rows(ByteWriter& w, const ExactRows& rows) {
  w.put<uint64_t>(static_cast<uint64_t>(rows.tokens));
  w.put<uint64_t>(rows.k.size());
  for (size_t r = 0; r < rows.k.size(); ++r) {
    w.array(rows.k[r]);
    w.array(rows.v[r]);
  }
}

ExactRows load_rows(ByteReader& r, int64_t rows, int64_t D, const char* field) {
  ExactRows out;
  const uint64_t tokens = r.get<uint64_t>(field);
  const uint64_t n_rows = r.get<uint64_t>(field);
  // Rows are sized only once tokens were stored; an empty store may hold none.
  if (n_rows != static_cast<uint64_t>(rows) && !(n_rows == 0 && tokens == 0))
    r.fail(field, "holds " + std::to_string(n_rows) + " rows, expected " + std::to_string(rows));
  if (D > 0 && tokens > r.left() / static_cast<uint64_t>(D))
    r.fail(field, std::to_string(tokens) + " tokens do not fit in the section");
  out.tokens = static_cast<int64_t>(tokens);
  out.resize_rows(static_cast<int64_t>(n_rows));
  for (uint64_t i = 0; i < n_rows; ++i) {
    out.k[i] = r.halves(field, tokens * static_cast<uint64_t>(D));
    out.v[i] = r.halves(field, tokens * static_cast<uint64_t>(D));
  }
  return out;
}

}  // namespace anchorkv::cache
