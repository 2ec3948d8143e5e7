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

namespace anchorkv::model {

// Whether the integer path handles weights of this type: Q4_0, Q8_0, Q4_K,
// Q5_K, Q6_K.
bool int8_matmul_supported(io::GgmlType type);

// Elements per activation group for weights of `type` (32 or 256).
int64_t int8_group(io::GgmlType type);

// How a matrix's blocks lie in memory.
//  kGguf: row-major GGML blocks, as in the file (row r at r * row_bytes).
//  kRows16: Q8_0, Q4_0, Q4_K and Q5_K rearranged losslessly for VNNI products with one
//    row per vector lane: rows in groups of 16 (the last padded with rows of
//    zero bytes, whose zero scales make their never-stored outputs zero),
//    group g at g * rows16_group_bytes(type, cols). A 64-byte load
//    then holds four weight bytes of each of the 16 rows, so a token's
//    product is a vpdpbusd per four elements (or per eight 4-bit ones) with
//    no horizontal sums, as llama.cpp's repacked weights. In a group:
//    Q8_0, for each of the cols / 32 blocks, 512 bytes [8][16 rows][4]
//      (element 4k + j of row i's block at k * 64 + i * 4 + j, stored as
//      w + 128, unsigned), then the blocks' fp16 scales [blocks][16]. A
//      block's 512 bytes are also an AMX tile's second operand as they lie.
//    Q4_0, per block 256 bytes [4 k][16 rows][4] (GGUF's nibble bytes
//      4 k .. 4 k + 3 of the row: elements 4 k + j low, 16 + 4 k + j high),
//      then the blocks' fp16 scales [blocks][16].
//    Q4_K, per 256-element super-block (2368 bytes): the nibble bytes
//      [4 c][8 k][16 rows][4] (GGUF's qs bytes 32 c + 4 k .. + 3 of the
//      row: elements 64 c + 4 k + j low, 64 c + 32 + 4 k + j high), the
//      sub-block scales [8][16 rows] and minimums [8][16 rows] as bytes,
//      then d [16] and dmin [16] in fp16.
//    Q5_K, per super-block (2880 bytes): as Q4_K, with each row's fifth
//      bits after the nibbles, [4 c][8 k][16 rows] bytes whose bit j (4 + j)
//      belongs to the low (high) nibble j of that row's word (c, k).
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
int64_t rows16_group_bytes(io::GgmlType type, int64_t cols);
int64_t rows16_bytes(io::GgmlType type, int64_t rows, int64_t cols);
// GGUF rows [rows, cols] -> kRows16 (out: rows16_bytes), and row r back to
// its GGUF bytes (gguf_row: the GGUF row size); the round trip is exact.
void pack_rows16(io::GgmlType type, const uint8_t* gguf, int64_t rows, int64_t cols, uint8_t* out);
void unpack_rows16_row(io::GgmlType type, const uint8_t* packed, int64_t cols, int64_t r, uint8_t* gguf_row);
// Row r as floats [cols] (io::dequantize_row of its GGUF bytes).
void dequantize_rows16_row(io::GgmlType type, const uint8_t* packed, int64_t cols, int64_t r, float* out);

// T tokens' activations quantized for one weight type (see Numerics).
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
// instructions. On by default where the CPU has them; tests switch them off
// to compare. Returns whether this CPU can run them.
bool byte_kernels_available();
void set_byte_kernels(bool on);

}  // namespace anchorkv::model
