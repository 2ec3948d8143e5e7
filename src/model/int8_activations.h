// Activations quantized to 8 bits for the integer matmuls (model/qmatmul.h
// has the numerics): per token, groups of 32 or 256 values share one fp32
// scale (absmax / 127), and every 32 values keep the sum of their integers
// (the K-quants' minimums and the byte kernels' offsets subtract it).
#pragma once

#include <cstdint>
#include <vector>

namespace anchorkv::model {

// T tokens' activations quantized for one weight type (model/qmatmul.h, Numerics).
struct Int8Activations {
  int64_t T = 0, cols = 0, group = 32;
  std::vector<int16_t> q;    // [T, cols]; int8 values, held as int16 for the multiply
  std::vector<int8_t> q8;    // [T, cols]; the same values as bytes (byte kernels: Q4_K)
  std::vector<float> scale;  // [T, cols / group]
  std::vector<int32_t> sum;  // [T, cols / 32]: sum of q per 32 elements
};

// x [T, cols] -> activations in groups of `group` (a divisor of cols).
// SIMD, bit-identical to quantize_int8_ref (tested).
void quantize_int8(const float* x, int64_t T, int64_t cols, int64_t group, Int8Activations* out, int threads);
void quantize_int8_ref(const float* x, int64_t T, int64_t cols, int64_t group, Int8Activations* out);

}  // namespace anchorkv::model
