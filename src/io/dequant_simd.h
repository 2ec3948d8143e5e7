// SIMD block dequantization for the most common GGML types (dequant_simd.cc).
#pragma once

#include <cstdint>

namespace anchorkv::io {

enum : int { kSimdQ8_0 = 1, kSimdQ4_0 = 2, kSimdQ4_K = 3, kSimdQ6_K = 4 };
// Dequantizes n_blocks consecutive blocks; false if this CPU target cannot
// (then nothing is written and the caller uses the scalar path).
bool dequant_blocks_simd(int type, const uint8_t* src, int64_t n_blocks, float* dst);

}  // namespace anchorkv::io
