#include "io/kvdump.h"

#include <cmath>
#include <cstring>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"

namespace anchorkv::io {

namespace {
constexpr const char* kOp = "anchorkv::kvdump";
constexpr size_t kHeader = 48;   // version 1
constexpr size_t kHeader2 = 64;  // version 2: + RoPE base and style

struct Header {
  char magic[4];
  uint32_t version, n_layers, n_heads, n_kv_heads, head_dim;
  uint64_t n_tokens;
  uint32_t dtype, reserved;
  uint64_t payload;
};
static_assert(sizeof(Header) == kHeader, "the .akv header is 48 bytes");
struct RopeTail {
  double base;
  uint32_t style, reserved;
};
static_assert(sizeof(RopeTail) == kHeader2 - kHeader, "the version 2 tail is 16 bytes");

// Floats per layer, or 0 on overflow.
uint64_t layer_floats(uint64_t heads, uint64_t kv, uint64_t hd, uint64_t n) {
  uint64_t a, b, c;
  if (__builtin_mul_overflow(heads, hd, &a) || __builtin_mul_overflow(a, n, &a)) return 0;
  if (__builtin_mul_overflow(kv, hd, &b) || __builtin_mul_overflow(b, n, &b) || __builtin_mul_overflow(b, 3, &b)) return 0;
  if (__builtin_add_overflow(a, b, &c)) return 0;
  return c;
}
}  // namespace

void write_kvdump(const std::string& path, const KVDump& d) {
  const uint64_t per = layer_floats(d.n_heads, d.n_kv_heads, d.head_dim, d.n_tokens);
  for (const auto& l : d.layers)
    if (l.q.size() != d.n_heads * d.head_dim * d.n_tokens ||
        l.k_post.size() != d.n_kv_heads * d.head_dim * d.n_tokens || l.k_pre.size() != l.k_post.size() ||
        l.v.size() != l.k_post.size())
      core::fail(ErrorCode::kInvalidArgument, kOp, "layer arrays do not match the dump's shape");
  const bool v2 = d.rope_base > 0;
  if (v2 && (!(d.rope_base > 1.0) || !std::isfinite(d.rope_base) || d.rope_style > 1))
    core::fail(ErrorCode::kInvalidArgument, kOp, "RoPE base must be finite and > 1, style 0 or 1");
  Header h{{'A', 'K', 'V', 'D'}, v2 ? 2u : 1u, static_cast<uint32_t>(d.layers.size()), d.n_heads, d.n_kv_heads,
           d.head_dim, d.n_tokens, 0, 0, per * 4 * d.layers.size()};
  std::vector<uint8_t> bytes;
  auto put = [&](const void* p, size_t n) {  // resize + memcpy: GCC 12 misreads vector::insert here
    const size_t at = bytes.size();
    bytes.resize(at + n);
    if (n > 0) std::memcpy(bytes.data() + at, p, n);
  };
  put(&h, sizeof(h));
  if (v2) {
    const RopeTail t{d.rope_base, d.rope_style, 0};
    put(&t, sizeof(t));
  }
  for (const auto& l : d.layers)
    for (const auto* a : {&l.q, &l.k_post, &l.k_pre, &l.v}) put(a->data(), a->size() * 4);
  core::write_file_atomically(path, bytes, kOp, "AKVD");  // replaces only a dump
}

KVDump parse_kvdump(const uint8_t* data, size_t size, const std::string& name) {
  auto bad = [&](const std::string& what) {
    core::fail(ErrorCode::kCorruptFile, kOp, "'" + name + "': " + what);
  };
  if (size < kHeader) bad("shorter than the 48-byte header");
  Header h;
  std::memcpy(&h, data, kHeader);
  if (std::memcmp(h.magic, "AKVD", 4) != 0) bad("bad magic (not an .akv dump)");
  if (h.version != 1 && h.version != 2) bad("unsupported version " + std::to_string(h.version) + " (1 and 2 are)");
  if (h.reserved != 0) bad("reserved header field is not 0");
  const size_t header = h.version == 2 ? kHeader2 : kHeader;
  RopeTail rope{0, 0, 0};
  if (h.version == 2) {
    if (size < kHeader2) bad("shorter than the 64-byte version 2 header");
    std::memcpy(&rope, data + kHeader, sizeof(rope));
    if (!(rope.base > 1.0) || !std::isfinite(rope.base)) bad("RoPE base must be finite and > 1");
    if (rope.style > 1) bad("RoPE style " + std::to_string(rope.style) + " is unknown (0 normal, 1 NeoX)");
    if (rope.reserved != 0) bad("reserved version 2 field is not 0");
  }
  if (h.dtype != 0) bad("unsupported dtype " + std::to_string(h.dtype) + " (0 = f32 is)");
  if (h.n_layers == 0 || h.n_heads == 0 || h.n_kv_heads == 0 || h.head_dim == 0 || h.n_tokens == 0)
    bad("a zero dimension in the header");
  if (h.n_heads % h.n_kv_heads != 0) bad("n_heads is not a multiple of n_kv_heads");
  const uint64_t per = layer_floats(h.n_heads, h.n_kv_heads, h.head_dim, h.n_tokens);
  uint64_t payload = 0;
  if (per == 0 || __builtin_mul_overflow(per, uint64_t{4} * h.n_layers, &payload)) bad("sizes overflow");
  if (payload != h.payload) bad("payload size " + std::to_string(h.payload) + " disagrees with the shape (" +
                                std::to_string(payload) + ")");
  if (size - header != payload)
    bad("file holds " + std::to_string(size - header) + " payload bytes, the header says " + std::to_string(payload));
  KVDump d;
  d.n_heads = h.n_heads;
  d.n_kv_heads = h.n_kv_heads;
  d.head_dim = h.head_dim;
  d.n_tokens = h.n_tokens;
  d.rope_base = rope.base;
  d.rope_style = rope.style;
  const uint8_t* p = data + header;
  auto take = [&](uint64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    std::memcpy(v.data(), p, n * 4);
    p += n * 4;
    return v;
  };
  const uint64_t nq = uint64_t{h.n_heads} * h.head_dim * h.n_tokens, nk = uint64_t{h.n_kv_heads} * h.head_dim * h.n_tokens;
  for (uint32_t l = 0; l < h.n_layers; ++l) {
    KVDumpLayer layer;
    layer.q = take(nq);
    layer.k_post = take(nk);
    layer.k_pre = take(nk);
    layer.v = take(nk);
    d.layers.push_back(std::move(layer));
  }
  return d;
}

KVDump read_kvdump(const std::string& path) {
  const core::MappedFile f = core::MappedFile::open(path, kOp);
  return parse_kvdump(f.data(), f.size(), path);
}

}  // namespace anchorkv::io
