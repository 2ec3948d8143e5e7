// GGUF reader (versions 2 and 3), memory-mapped, validating everything the
// format fixes: magic, version, counts, string lengths, value types, tensor
// dims and types, offsets, alignment, with overflow-safe size arithmetic.
// Every violation is an anchorkv::Error(kCorruptFile) naming the file and
// what is wrong; nothing is read outside the mapping.
//
// Layout (little-endian): "GGUF" u32 version, u64 tensor_count, u64 kv_count,
// kv_count x (string key, u32 type, value), tensor_count x (string name,
// u32 n_dims, u64 dims[n_dims], u32 ggml_type, u64 offset), padding to
// general.alignment (default 32), tensor data. string = u64 length + bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace anchorkv::io {

enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};
const char* ggml_type_name(GgmlType t);
// Elements per block and bytes per block; false for types this reader does not know.
bool ggml_block(GgmlType t, int64_t* block_elems, int64_t* block_bytes);

struct GgufArray;
// Integers are widened to int64/uint64, floats to double.
using GgufValue = std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>>;
struct GgufArray {
  GgufValueType elem_type;
  std::vector<GgufValue> items;
};

struct GgufTensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;  // ne[0] (innermost, contiguous) first
  uint64_t offset = 0;        // from the start of the tensor data
  int64_t n_elements = 0;
  int64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping
};

class GgufFile {
 public:
  // Maps and validates `path`. Throws Error(kIo) or Error(kCorruptFile).
  static GgufFile open(const std::string& path);
  // Validates a copy of the bytes (tests, fuzzing).
  static GgufFile from_memory(const uint8_t* data, size_t size, const std::string& name = "<memory>");

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  // Typed access; throws Error(kCorruptFile) naming the key if missing or of another kind.
  std::string get_string(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;  // any non-negative integer
  double get_float(const std::string& key) const;   // any float or integer
  const GgufArray& get_array(const std::string& key) const;
  const GgufTensor* find_tensor(const std::string& name) const;  // nullptr if absent
  const GgufTensor& tensor(const std::string& name) const;       // throws if absent

 private:
  GgufFile() = default;
  void parse();
  struct Mapping;
  std::unique_ptr<Mapping> map_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
};

// Whether dequantize_row handles the type: F32, F16, BF16, Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (dequant.cc documents each layout).
bool can_dequantize(GgmlType type);
// Dequantize n elements (a multiple of the block size) of a row to f32.
// Throws Error(kUnsupported) for other types, kInvalidArgument for a bad n.
// Q8_0, Q4_0, Q4_K and Q6_K run SIMD kernels, bit-identical to the scalar reference.
void dequantize_row(GgmlType type, const uint8_t* src, int64_t n, float* dst);
void dequantize_row_ref(GgmlType type, const uint8_t* src, int64_t n, float* dst);

}  // namespace anchorkv::io
