// Bulk fp16 conversions and the fp16-range check, SIMD (F16C/AVX-512 through
// Highway) with the scalar reference in core/half.h as the definition. On CPUs
// without hardware fp16 conversion the scalar code runs, so results are the
// same bits everywhere.
#pragma once

#include <cstdint>

namespace anchorkv::core {

void f32_to_f16_n(const float* in, uint16_t* out, int64_t n);
void f16_to_f32_n(const uint16_t* in, float* out, int64_t n);
// in -> out rounded to the nearest fp16 value (out may alias in).
void round_to_f16_n(const float* in, float* out, int64_t n);
// Index of the first element that is NaN, +-Inf or has |x| > 65504; -1 if none.
int64_t find_outside_fp16(const float* in, int64_t n);
int64_t find_outside_fp16_ref(const float* in, int64_t n);

}  // namespace anchorkv::core
