// The kRows16 weight layout (model::QuantLayout::kRows16): GGUF blocks of
// Q8_0, Q4_0, Q4_K and Q5_K rearranged in groups of 16 rows, packed at load
// and read by the VNNI row kernels (model/qmatmul.cc) and the AMX tiles
// (model/amx_matmul.cc).
#pragma once

#include <cstdint>

#include "io/gguf.h"

namespace anchorkv::model {

// kRows16: Q8_0, Q4_0, Q4_K and Q5_K rearranged losslessly for VNNI products with one
//  row per vector lane: rows in groups of 16 (the last padded with rows of
//  zero bytes, whose zero scales make their never-stored outputs zero),
//  group g at g * rows16_group_bytes(type, cols). A 64-byte load
//  then holds four weight bytes of each of the 16 rows, so a token's
//  product is a vpdpbusd per four elements (or per eight 4-bit ones) with
//  no horizontal sums, as llama.cpp's repacked weights. In a group:
//  Q8_0, for each of the cols / 32 blocks, 512 bytes [8][16 rows][4]
//    (element 4k + j of row i's block at k * 64 + i * 4 + j, stored as
//    w + 128, unsigned), then the blocks' fp16 scales [blocks][16]. A
//    block's 512 bytes are also an AMX tile's second operand as they lie.
//  Q4_0, per block 256 bytes [4 k][16 rows][4] (GGUF's nibble bytes
//    4 k .. 4 k + 3 of the row: elements 4 k + j low, 16 + 4 k + j high),
//    then the blocks' fp16 scales [blocks][16].
//  Q4_K, per 256-element super-block (2368 bytes): the nibble bytes
//    [4 c][8 k][16 rows][4] (GGUF's qs bytes 32 c + 4 k .. + 3 of the
//    row: elements 64 c + 4 k + j low, 64 c + 32 + 4 k + j high), the
//    sub-block scales [8][16 rows] and minimums [8][16 rows] as bytes,
//    then d [16] and dmin [16] in fp16.
//  Q5_K, per super-block (2880 bytes): as Q4_K, with each row's fifth
//    bits after the nibbles, [4 c][8 k][16 rows] bytes whose bit j (4 + j)
//    belongs to the low (high) nibble j of that row's word (c, k).

// Where the parts of a Q4_K / Q5_K super-block of 16 rows lie: nibbles,
// Q5_K's fifth bits, sub-block scales, minimums, d, dmin.
struct KRows16 {
  int64_t high, sc, m, d, dmin, bytes;
  static constexpr KRows16 of(bool five) {
    const int64_t h = five ? 512 : 0;
    return {2048, 2048 + h, 2176 + h, 2304 + h, 2336 + h, 2368 + h};
  }
};

int64_t rows16_group_bytes(io::GgmlType type, int64_t cols);
int64_t rows16_bytes(io::GgmlType type, int64_t rows, int64_t cols);
// GGUF rows [rows, cols] -> kRows16 (out: rows16_bytes), and row r back to
// its GGUF bytes (gguf_row: the GGUF row size); the round trip is exact.
void pack_rows16(io::GgmlType type, const uint8_t* gguf, int64_t rows, int64_t cols, uint8_t* out);
void unpack_rows16_row(io::GgmlType type, const uint8_t* packed, int64_t cols, int64_t r, uint8_t* gguf_row);
// Row r as floats [cols] (io::dequantize_row of its GGUF bytes).
void dequantize_rows16_row(io::GgmlType type, const uint8_t* packed, int64_t cols, int64_t r, float* out);

}  // namespace anchorkv::model
