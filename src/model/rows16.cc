#include "model/rows16.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "io/ggml_blocks.h"
#include "model/kquant_scales.h"

namespace anchorkv::model {

namespace {

// Where word k (four bytes) of row i lies in a block of 16 rows: the rows'
// words side by side.
constexpr int64_t word16(int64_t k, int64_t i) { return k * 64 + i * 4; }

void pack_q8_0_group(const uint8_t* rows, int64_t n, int64_t nb, uint8_t* group) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = rows + (i * nb + b) * io::kQ8_0Block.bytes;
      for (int64_t k = 0; k < 8; ++k) {  // a word of four bytes at a time, w to w + 128
        uint32_t w;
        std::memcpy(&w, blk + 2 + 4 * k, 4);
        w ^= 0x80808080u;
        std::memcpy(group + b * 512 + word16(k, i), &w, 4);
      }
      std::memcpy(group + nb * 512 + b * 32 + i * 2, blk, 2);
    }
}
void unpack_q8_0_row(const uint8_t* group, int64_t nb, int64_t i, uint8_t* row) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = row + b * io::kQ8_0Block.bytes;
    std::memcpy(blk, group + nb * 512 + b * 32 + i * 2, 2);
    for (int64_t k = 0; k < 8; ++k) {  // a word of four bytes at a time, w + 128 back to w
      uint32_t w;
      std::memcpy(&w, group + b * 512 + word16(k, i), 4);
      w ^= 0x80808080u;
      std::memcpy(blk + 2 + 4 * k, &w, 4);
    }
  }
}

void pack_q4_0_group(const uint8_t* rows, int64_t n, int64_t nb, uint8_t* group) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = rows + (i * nb + b) * io::kQ4_0Block.bytes;
      for (int64_t w = 0; w < 4; ++w) std::memcpy(group + b * 256 + word16(w, i), blk + 2 + 4 * w, 4);
      std::memcpy(group + nb * 256 + b * 32 + i * 2, blk, 2);
    }
}
void unpack_q4_0_row(const uint8_t* group, int64_t nb, int64_t i, uint8_t* row) {
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = row + b * io::kQ4_0Block.bytes;
    std::memcpy(blk, group + nb * 256 + b * 32 + i * 2, 2);
    for (int64_t w = 0; w < 4; ++w) std::memcpy(blk + 2 + 4 * w, group + b * 256 + word16(w, i), 4);
  }
}

// Q4_K (144-byte super-blocks: d, dmin, 12 bytes of scales, 128 of nibbles)
// or Q5_K (176: the same, with 32 bytes qh before the nibbles; bit j of
// qh[l] is the fifth bit of element l of sub-block j).
void pack_q45_k_group(const uint8_t* rows, int64_t n, int64_t nsb, bool five, uint8_t* group) {
  const KRows16 L = KRows16::of(five);
  const int64_t block_bytes = five ? io::kQ5_KBlock.bytes : io::kQ4_KBlock.bytes, qs = five ? 48 : 16;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < nsb; ++s) {
      const uint8_t* blk = rows + i * nsb * block_bytes + s * block_bytes;
      uint8_t* out = group + s * L.bytes;
      for (int64_t w = 0; w < 32; ++w) std::memcpy(out + word16(w, i), blk + qs + 4 * w, 4);
      for (int64_t c = 0; c < 4 && five; ++c)
        for (int64_t k = 0; k < 8; ++k) {
          uint8_t h = 0;
          for (int j = 0; j < 4; ++j)
            h |= static_cast<uint8_t>(((blk[16 + 4 * k + j] >> (2 * c)) & 1) << j |
                                      ((blk[16 + 4 * k + j] >> (2 * c + 1)) & 1) << (4 + j));
          out[L.high + (c * 8 + k) * 16 + i] = h;
        }
      uint8_t sc[8], m[8];
      unpack_scales_k4(blk + 4, sc, m);
      for (int j = 0; j < 8; ++j) out[L.sc + j * 16 + i] = sc[j], out[L.m + j * 16 + i] = m[j];
      std::memcpy(out + L.d + i * 2, blk, 2);
      std::memcpy(out + L.dmin + i * 2, blk + 2, 2);
    }
}
void unpack_q45_k_row(const uint8_t* group, int64_t nsb, bool five, int64_t i, uint8_t* row) {
  const KRows16 L = KRows16::of(five);
  const int64_t block_bytes = five ? io::kQ5_KBlock.bytes : io::kQ4_KBlock.bytes, qs = five ? 48 : 16;
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* in = group + s * L.bytes;
    uint8_t* blk = row + s * block_bytes;
    std::memcpy(blk, in + L.d + i * 2, 2);
    std::memcpy(blk + 2, in + L.dmin + i * 2, 2);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) sc[j] = in[L.sc + j * 16 + i], m[j] = in[L.m + j * 16 + i];
    pack_scales_k4(sc, m, blk + 4);
    for (int64_t w = 0; w < 32; ++w) std::memcpy(blk + qs + 4 * w, in + word16(w, i), 4);
    if (!five) continue;
    for (int64_t k = 0; k < 8; ++k) {  // qh[4k + j]: bit 2c from bit j of byte (c, k), bit 2c + 1 from bit 4 + j
      uint32_t qh = 0;
      for (int64_t c = 0; c < 4; ++c) {
        const uint32_t h = in[L.high + (c * 8 + k) * 16 + i];
        // bits 0-3 and 4-7 of h to bit 0 of bytes 0-3, then to bits 2c and 2c + 1
        const uint32_t lo = (h & 1) | (h >> 1 & 1) << 8 | (h >> 2 & 1) << 16 | (h >> 3 & 1) << 24;
        const uint32_t hi = (h >> 4 & 1) | (h >> 5 & 1) << 8 | (h >> 6 & 1) << 16 | (h >> 7 & 1) << 24;
        qh |= lo << (2 * c) | hi << (2 * c + 1);
      }
      std::memcpy(blk + 16 + 4 * k, &qh, 4);
    }
  }
}
}  // namespace

int64_t rows16_group_bytes(io::GgmlType type, int64_t cols) {
  if (type == io::GgmlType::kQ4_K || type == io::GgmlType::kQ5_K)
    return cols / 256 * KRows16::of(type == io::GgmlType::kQ5_K).bytes;
  const int64_t block = type == io::GgmlType::kQ4_0 ? 256 + 32 : 512 + 32;  // 16 rows' bytes and scales
  return (cols / 32 * block + 63) / 64 * 64;
}

int64_t rows16_bytes(io::GgmlType type, int64_t rows, int64_t cols) {
  return (rows + 15) / 16 * rows16_group_bytes(type, cols);
}

void pack_rows16(io::GgmlType type, const uint8_t* gguf, int64_t rows, int64_t cols, uint8_t* out) {
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  const int64_t row_bytes = cols / be * bb, group_bytes = rows16_group_bytes(type, cols);
  // Groups are independent: split across the cores (a model's weights are
  // rearranged at load, gigabytes for a 7B model).
  constexpr int64_t kGroupsPerTask = 16;
  const int64_t groups = (rows + 15) / 16;
  core::parallel_for((groups + kGroupsPerTask - 1) / kGroupsPerTask, 0, [&](int64_t task) {
    for (int64_t g = task * kGroupsPerTask; g < std::min(groups, (task + 1) * kGroupsPerTask); ++g) {
      const int64_t n = std::min<int64_t>(16, rows - g * 16);
      const uint8_t* in = gguf + g * 16 * row_bytes;
      uint8_t* group = out + g * group_bytes;
      std::memset(group, 0, static_cast<size_t>(group_bytes));  // padding rows: zero scales
      if (type == io::GgmlType::kQ4_K || type == io::GgmlType::kQ5_K)
        pack_q45_k_group(in, n, cols / 256, type == io::GgmlType::kQ5_K, group);
      else if (type == io::GgmlType::kQ4_0)
        pack_q4_0_group(in, n, cols / 32, group);
      else
        pack_q8_0_group(in, n, cols / 32, group);
    }
  });
}

void unpack_rows16_row(io::GgmlType type, const uint8_t* packed, int64_t cols, int64_t r, uint8_t* gguf_row) {
  const uint8_t* group = packed + r / 16 * rows16_group_bytes(type, cols);
  if (type == io::GgmlType::kQ4_K || type == io::GgmlType::kQ5_K)
    unpack_q45_k_row(group, cols / 256, type == io::GgmlType::kQ5_K, r % 16, gguf_row);
  else if (type == io::GgmlType::kQ4_0)
    unpack_q4_0_row(group, cols / 32, r % 16, gguf_row);
  else
    unpack_q8_0_row(group, cols / 32, r % 16, gguf_row);
}

void dequantize_rows16_row(io::GgmlType type, const uint8_t* packed, int64_t cols, int64_t r, float* out) {
  int64_t be = 0, bb = 0;
  io::ggml_block(type, &be, &bb);
  thread_local std::vector<uint8_t> row;
  row.resize(static_cast<size_t>(cols / be * bb));
  unpack_rows16_row(type, packed, cols, r, row.data());
  io::dequantize_row(type, row.data(), cols, out);
}

}  // namespace anchorkv::model
