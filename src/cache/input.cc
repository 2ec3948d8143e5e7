#include "cache/input.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/half.h"

namespace anchorkv::cache {
namespace {

void check_view(std::string_view op, const char* name, const TensorView& t) {
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 0)
      core::fail(ErrorCode::kInvalidArgument, op, std::string(name) + " has a negative dimension: " + shape_string(t.shape));
    if (t.strides[i] < 0)
      core::fail(ErrorCode::kInvalidArgument, op, std::string(name) + " has a negative stride");
  }
  if (t.shape[0] < 1 || t.shape[1] < 1)
    core::fail(ErrorCode::kInvalidArgument, op,
               std::string(name) + " needs B >= 1 and H >= 1, got " + shape_string(t.shape));
  if (t.shape[3] < 1)
    core::fail(ErrorCode::kInvalidArgument, op, std::string(name) + " has head dim D = 0: " + shape_string(t.shape));
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16)
    core::fail(ErrorCode::kInvalidArgument, op, std::string(name) + " has an unknown dtype");
  if (t.numel() > 0 && t.data == nullptr)
    core::fail(ErrorCode::kInvalidArgument, op, std::string(name) + " has null data");
}

void convert(std::string_view op, const char* name, const TensorView& t, std::vector<uint16_t>& out) {
  const auto& s = t.shape;
  out.resize(static_cast<size_t>(t.numel()));
  int64_t i = 0;
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t p = 0; p < s[2]; ++p)
        for (int64_t d = 0; d < s[3]; ++d, ++i) {
          const float x = t.at(b, h, p, d);
          if (!std::isfinite(x))
            core::fail(ErrorCode::kNonFinite, op,
                       std::string(name) + " holds a non-finite value (" + std::to_string(x) + ") at [" +
                           std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(p) + ", " +
                           std::to_string(d) + "]");
          if (std::fabs(x) > core::kFp16Max)
            core::fail(ErrorCode::kOutOfRange, op,
                       std::string(name) + " value " + std::to_string(x) + " at [" + std::to_string(b) + ", " +
                           std::to_string(h) + ", " + std::to_string(p) + ", " + std::to_string(d) +
                           "] is beyond the fp16 range (|x| <= 65504)");
          out[static_cast<size_t>(i)] = core::float_to_half(x);
        }
}

}  // namespace

StagedInput stage_input(std::string_view op, const TensorView& keys, const TensorView& values,
                        bool has_expected, int64_t expected_B, int64_t expected_H, int64_t expected_D) {
  check_view(op, "keys", keys);
  check_view(op, "values", values);
  if (keys.shape != values.shape)
    core::fail(ErrorCode::kShapeMismatch, op,
               "keys and values differ: keys " + shape_string(keys.shape) + " vs values " + shape_string(values.shape));
  if (has_expected && (keys.shape[0] != expected_B || keys.shape[1] != expected_H || keys.shape[3] != expected_D))
    core::fail(ErrorCode::kShapeMismatch, op,
               "shape " + shape_string(keys.shape) + " does not match the cache's B=" + std::to_string(expected_B) +
                   ", H=" + std::to_string(expected_H) + ", D=" + std::to_string(expected_D) + " from earlier calls");
  StagedInput in;
  in.shape = keys.shape;
  convert(op, "keys", keys, in.k);
  convert(op, "values", values, in.v);
  return in;
}

void ExactRows::append(const StagedInput& in) {
  const int64_t rows = in.B() * in.H();
  const size_t n = static_cast<size_t>(in.S() * in.D());
  resize_rows(rows);
  for (int64_t r = 0; r < rows; ++r) {
    k[r].reserve(k[r].size() + n);
    v[r].reserve(v[r].size() + n);
  }
  for (int64_t r = 0; r < rows; ++r) {
    k[r].insert(k[r].end(), in.key_row(r), in.key_row(r) + n);
    v[r].insert(v[r].end(), in.value_row(r), in.value_row(r) + n);
  }
  tokens += in.S();
}

void ExactRows::clear() {
  for (auto& x : k) std::vector<uint16_t>().swap(x);
  for (auto& x : v) std::vector<uint16_t>().swap(x);
  tokens = 0;
}

int64_t ExactRows::buffer_bytes() const {
  int64_t n = 0;
  for (const auto& x : k) n += static_cast<int64_t>(x.size() * sizeof(uint16_t));
  for (const auto& x : v) n += static_cast<int64_t>(x.size() * sizeof(uint16_t));
  return n;
}

}  // namespace anchorkv::cache
