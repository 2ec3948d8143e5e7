// Types the attention kernels share across SIMD targets (defined once, not
// per target): decoded entry metadata, lines to request ahead, fused keys.
#pragma once

#include <cstdint>

namespace anchorkv::kernels {
// Room past a residual list's last entry: DecodeMeta* store whole vectors.
constexpr int64_t kListSlack = 64;

// Decoded entry metadata without positions: anchor ordinals per entry and the
// (chunk-local) indices of entries that carry a K / V residual.
struct MetaOut {
  int32_t* ak;
  int32_t* av;
  int32_t* res_k;
  int32_t* res_v;
  int64_t nk = 0, nv = 0;
};

// Byte ranges of the cache to request into L2 while a loop computes: the
// next sub-tile's streams, whose lines would otherwise arrive only when its
// passes read them (the hardware prefetchers did not run that far ahead).
// The requests are spread over the sub-tile's passes (exps, key and value
// residuals): all in the exp loop, they stalled it once the line fill
// buffers were full (perf: ~11% of its samples on the prefetches, from
// memory) while the residual passes left the memory idle.
struct LinesAhead {
  static constexpr int kMax = 6;
  const char* at[kMax];
  int64_t left[kMax];  // bytes of the range from `at` on
  int n = 0, i = 0;
  void add(const void* p, int64_t bytes) {
    if (bytes <= 0 || n == kMax) return;
    at[n] = static_cast<const char*>(p);
    left[n++] = bytes;
  }
  // One line of the current range (none once all are requested).
  void request_one() {
    if (i == n) return;
    __builtin_prefetch(at[i], 0, 2);
    if (left[i] > 64) {
      at[i] += 64, left[i] -= 64;
    } else {
      ++i;
    }
  }
};

// Pre-RoPE key residuals coded as given, fused into their entries' anchor
// scores (QuadRopeScores): entry i's key is gamma_i (a + Z[zi[i]]) when
// zi[i] >= 0, the row scaled by scale / gamma_i. zi null: none; zero: D
// zeros (what an entry without one adds in a group that has some).
struct FusedKeys {
  const int32_t* zi = nullptr;
  const float* Z = nullptr;
  const float* zero = nullptr;
};

// How 2-bit residual codes enter the arithmetic of attention.
//   fp32: codes decode to the codec's levels; products and sums in fp32.
//   bf16 (AVX-512 BF16, the default where the CPU has it): the levels are
//     scaled by lambda, chosen so both magnitudes are exact in bf16 (within
//     3e-5 of lambda x level for the 2-bit Lloyd-Max levels), and 1 / lambda
//     joins each residual's scale; key residuals are scored against the
//     rotated queries rounded to bf16, value residuals summed with weights
//     bf16(p * scale / lambda). Products of bf16 numbers are exact in fp32 and
//     sums stay fp32, so the error is the rounding of those inputs (2^-9
//     relative each; docs/benchmarks.md measures it). The fast kernels take
//     two products per lane and instruction (VDPBF16PS); the scalar twins
//     round the same inputs and multiply in fp32.
struct ResidualArithmetic {
  bool bf16 = false;
  float levels[4] = {};     // what a 2-bit code decodes to (bf16: times lambda)
  float inv_lambda = 1.0f;  // on every residual scale (fp32: 1)
  // bf16 pairs (levels[n & 3] low, levels[n >> 2] high) for n < 16: the fast
  // kernels' table from two codes at once to the two numbers they multiply.
  uint32_t pairs[16] = {};
};

}  // namespace anchorkv::kernels

// The targets with 16-lane vectors and the AVX-512 intrinsics SumsOf16 uses
// (expanded where used, so per target).
#define ANCHORKV_AVX512_TARGET (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
// A function that uses AVX-512 BF16 instructions inside such a target:
// GCC adds the attribute to the target's features, clang replaces them with
// it, so for clang it names the target's features as well.
#if defined(__clang__)
#define ANCHORKV_BF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
#else
#define ANCHORKV_BF16_ATTR __attribute__((target("avx512bf16")))
#endif
