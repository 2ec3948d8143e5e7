// The geometry of GGML's quantized blocks (ggml-common.h): elements and bytes
// per block. The loader (io/gguf.cc, io/dequant_simd.cc) and the matmul
// kernels (model/qmatmul*.cc, model/amx_matmul.cc) read it from here; the
// table at the top of io/dequant.cc gives each block's fields.
#pragma once

#include <cstdint>

namespace anchorkv::io {

struct BlockGeometry {
  int64_t elems;  // weights per block
  int64_t bytes;  // bytes per block
};

inline constexpr BlockGeometry kQ4_0Block{32, 18}, kQ4_1Block{32, 20}, kQ5_0Block{32, 22}, kQ5_1Block{32, 24},
    kQ8_0Block{32, 34}, kQ8_1Block{32, 36};
// K-quants: super-blocks of 256 weights
inline constexpr BlockGeometry kQ2_KBlock{256, 84}, kQ3_KBlock{256, 110}, kQ4_KBlock{256, 144},
    kQ5_KBlock{256, 176}, kQ6_KBlock{256, 210}, kQ8_KBlock{256, 292};

}  // namespace anchorkv::io
