// Matmuls on quantized weights with 8-bit activations (as llama.cpp runs
// them): each token's activations are quantized per group to int8 values and
// one f32 scale, and every weight block is multiplied with them in integers
// (16-bit lanes, pairwise-added into 32-bit sums), converted to float once per
// group.
//
// Numerics. Activation group g of a token (G elements: 32 for Q4_0/Q8_0, 256
// for the K-quants' super-blocks) becomes q_i = round(x_i / s_g), |q_i| <= 127,
// s_g = max|x| / 127 (round to nearest even; a group holding a NaN or an
// infinity gets s_g = NaN, so the output says so). Then
//   y = sum_g w_scale_g * s_g * sum_i wq_i * q_i  -  sum_k w_min_k * s_g(k) * sum_{i in k} q_i
// where wq are the block's integers times its integer sub-scales (exact in
// int16: at most 32 * 128) and k runs over the 32-element sub-blocks of the
// K-quants that carry a minimum (Q4_K, Q5_K). Integer sums are exact (int32
// cannot overflow: 256 * 4096 * 127 < 2^31); the float part is summed in
// vector lanes. Against f32 activations the relative error of a dot product is
// about 2^-8 / sqrt(G) of sum |w x| (the activations' rounding), the same as
// llama.cpp's Q8_0/Q8_K activations.
//
// Determinism: an output depends only on its row and token, never on the
// thread count (threads split rows).
#pragma once

#include <cstdint>
#include <vector>

#include "io/gguf.h"
#include "model/int8_activations.h"
#include "model/rows16.h"

namespace anchorkv::model {

// Whether the integer path handles weights of this type: Q4_0, Q8_0, Q4_K,
// Q5_K, Q6_K.
bool int8_matmul_supported(io::GgmlType type);

// Elements per activation group for weights of `type` (32 or 256).
int64_t int8_group(io::GgmlType type);

// How a matrix's blocks lie in memory.
//  kGguf: row-major GGML blocks, as in the file (row r at r * row_bytes).
//  kRows16: Q8_0, Q4_0, Q4_K and Q5_K rearranged losslessly for VNNI products with one
//    row per vector lane (model/rows16.h has the format).
enum class QuantLayout : uint8_t { kGguf, kRows16 };

// A weight matrix [rows, cols] in its GGML blocks. row_bytes is the GGUF
// row's size in either layout.
struct QuantMatrix {
  io::GgmlType type = io::GgmlType::kQ8_0;
  const uint8_t* blocks = nullptr;
  int64_t rows = 0, cols = 0, row_bytes = 0;
  QuantLayout layout = QuantLayout::kGguf;
};

// Whether this CPU multiplies kRows16 matrices of this type (Q8_0, Q4_0, Q4_K, Q5_K;
// needs AVX-512 VNNI); a runtime holds those weights in that layout only
// where it does.
bool rows16_supported(io::GgmlType type);

// y [T, W.rows] = x [T, W.cols] W^T with 8-bit activations. Throws
// Error(kUnsupported) for a type int8_matmul_supported rejects.
void matmul_int8(const float* x, int64_t T, const QuantMatrix& W, float* y, int threads);
// Several matrices applied to the same x (a layer's Q, K and V; gate and up):
// y[m] = x W[m]^T, activations quantized once per group size, one parallel
// pass over all the rows. The matrices must share cols.
void matmul_int8_batch(const float* x, int64_t T, const QuantMatrix* W, float* const* y, int n, int threads);
// Scalar twin: the same activations, weights from dequantize_row_ref, dot
// products in double. Agrees with matmul_int8 to float rounding of the
// weights' scales and of the lane sums (tested).
void matmul_int8_ref(const float* x, int64_t T, const QuantMatrix& W, float* y);

// Q4_K and Q6_K rows on CPUs with AVX-512BW take byte kernels (unsigned
// weight integers times signed 8-bit activations, vpmaddubsw then vpmaddwd by
// the sub-scales, as llama.cpp's AVX2 path; Q6_K's -32 offset comes back as
// 32 * sum(scale * x)): the same integer sums as the 16-bit kernels, half the
// instructions. Which of these kernels run is model/matmul_kernels.h's choice.

}  // namespace anchorkv::model
