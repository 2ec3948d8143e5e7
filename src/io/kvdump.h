// The K/V dump format (".akv"): per-layer Q, K (before and after RoPE) and V
// of one prompt, written by `anchorkv dump-kv` and read by `anchorkv compare
// --workload FILE`. Spec: docs/kvdump.md.
//
// Little-endian. Header (48 bytes in version 1, 64 in version 2):
//   char[4] "AKVD", u32 version (1 or 2), u32 n_layers, u32 n_heads, u32 n_kv_heads,
//   u32 head_dim, u64 n_tokens, u32 dtype (0 = f32), u32 reserved (0),
//   u64 payload_bytes (= n_layers * per_layer)
//   version 2 only: f64 rope_base (> 1), u32 rope_style (0 normal, 1 NeoX), u32 reserved (0)
// then per layer, f32 row-major:
//   Q [n_heads, n_tokens, head_dim]  (after RoPE)
//   K_post [n_kv_heads, n_tokens, head_dim], K_pre [same], V [same]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace anchorkv::io {

struct KVDumpLayer {
  std::vector<float> q, k_post, k_pre, v;
};

struct KVDump {
  uint32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  uint64_t n_tokens = 0;
  double rope_base = 0;     // 0: unknown (a version 1 file)
  uint32_t rope_style = 0;  // 0 normal (adjacent pairs), 1 NeoX
  std::vector<KVDumpLayer> layers;
};

// Throws Error(kIo) / Error(kCorruptFile) naming the problem. Writes version 2
// when rope_base > 0, else version 1; reads both.
void write_kvdump(const std::string& path, const KVDump& d);
KVDump read_kvdump(const std::string& path);
KVDump parse_kvdump(const uint8_t* data, size_t size, const std::string& name = "<memory>");

}  // namespace anchorkv::io
