#include "io/gguf.h"

#include <cstring>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "core/mapped_file.h"
#include "io/ggml_blocks.h"

namespace anchorkv::io {

namespace {
constexpr const char* kOp = "anchorkv::GgufFile";
constexpr uint64_t kMaxDims = 4;
}  // namespace

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return "F32";
    case GgmlType::kF16:
      return "F16";
    case GgmlType::kQ4_0:
      return "Q4_0";
    case GgmlType::kQ4_1:
      return "Q4_1";
    case GgmlType::kQ5_0:
      return "Q5_0";
    case GgmlType::kQ5_1:
      return "Q5_1";
    case GgmlType::kQ8_0:
      return "Q8_0";
    case GgmlType::kQ8_1:
      return "Q8_1";
    case GgmlType::kQ2_K:
      return "Q2_K";
    case GgmlType::kQ3_K:
      return "Q3_K";
    case GgmlType::kQ4_K:
      return "Q4_K";
    case GgmlType::kQ5_K:
      return "Q5_K";
    case GgmlType::kQ6_K:
      return "Q6_K";
    case GgmlType::kQ8_K:
      return "Q8_K";
    case GgmlType::kBF16:
      return "BF16";
  }
  return "?";
}

bool ggml_block(GgmlType t, int64_t* elems, int64_t* bytes) {
  struct B {
    GgmlType t;
    int64_t e, b;
  };
  static const B table[] = {
      {GgmlType::kF32, 1, 4},      {GgmlType::kF16, 1, 2},      {GgmlType::kBF16, 1, 2},
      {GgmlType::kQ4_0, kQ4_0Block.elems, kQ4_0Block.bytes}, {GgmlType::kQ4_1, kQ4_1Block.elems, kQ4_1Block.bytes},
      {GgmlType::kQ5_0, kQ5_0Block.elems, kQ5_0Block.bytes}, {GgmlType::kQ5_1, kQ5_1Block.elems, kQ5_1Block.bytes},
      {GgmlType::kQ8_0, kQ8_0Block.elems, kQ8_0Block.bytes}, {GgmlType::kQ8_1, kQ8_1Block.elems, kQ8_1Block.bytes},
      {GgmlType::kQ2_K, kQ2_KBlock.elems, kQ2_KBlock.bytes}, {GgmlType::kQ3_K, kQ3_KBlock.elems, kQ3_KBlock.bytes},
      {GgmlType::kQ4_K, kQ4_KBlock.elems, kQ4_KBlock.bytes}, {GgmlType::kQ5_K, kQ5_KBlock.elems, kQ5_KBlock.bytes},
      {GgmlType::kQ6_K, kQ6_KBlock.elems, kQ6_KBlock.bytes}, {GgmlType::kQ8_K, kQ8_KBlock.elems, kQ8_KBlock.bytes}};
  for (const B& b : table)
    if (b.t == t) {
      *elems = b.e;
      *bytes = b.b;
      return true;
    }
  return false;
}

// ---------------------------------------------------------------- mapping

struct GgufFile::Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;
  core::MappedFile file;      // the mapped file, or
  std::vector<uint8_t> copy;  // an owned copy
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.name_ = path;
  f.map_ = std::make_unique<Mapping>();
  f.map_->file = core::MappedFile::open(path, kOp);
  f.map_->data = f.map_->file.data();
  f.map_->size = f.map_->file.size();
  f.parse();
  return f;
}

GgufFile GgufFile::from_memory(const uint8_t* data, size_t size, const std::string& name) {
  GgufFile f;
  f.name_ = name;
  f.map_ = std::make_unique<Mapping>();
  f.map_->copy.assign(data, data + size);
  f.map_->data = f.map_->copy.data();
  f.map_->size = size;
  f.parse();
  return f;
}

// ---------------------------------------------------------------- parsing

namespace {

class Cursor {
 public:
  Cursor(const uint8_t* d, size_t n, const std::string& file) : d_(d), n_(n), file_(file) {}
  size_t pos() const { return p_; }
  size_t remaining() const { return n_ - p_; }
  [[noreturn]] void corrupt(const std::string& what) const {
    core::fail(ErrorCode::kCorruptFile, kOp, "'" + file_ + "' at byte " + std::to_string(p_) + ": " + what);
  }
  void need(uint64_t bytes, const char* what) const {
    if (bytes > remaining())
      corrupt(std::string("truncated: ") + what + " needs " + std::to_string(bytes) + " bytes, " +
              std::to_string(remaining()) + " left");
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, d_ + p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(d_ + p_), static_cast<size_t>(len));
    p_ += static_cast<size_t>(len);
    return s;
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t p_ = 0;
  const std::string& file_;
};

// Smallest encoding of one value of a type (bounds array counts before allocating).
uint64_t min_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
      return 8;
    case GgufValueType::kString:
      return 8;
    case GgufValueType::kArray:
      return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) { return t <= 12; }

GgufValue read_value(Cursor& c, GgufValueType t, int depth) {
  switch (t) {
    case GgufValueType::kU8:
      return static_cast<uint64_t>(c.read<uint8_t>("u8"));
    case GgufValueType::kI8:
      return static_cast<int64_t>(c.read<int8_t>("i8"));
    case GgufValueType::kU16:
      return static_cast<uint64_t>(c.read<uint16_t>("u16"));
    case GgufValueType::kI16:
      return static_cast<int64_t>(c.read<int16_t>("i16"));
    case GgufValueType::kU32:
      return static_cast<uint64_t>(c.read<uint32_t>("u32"));
    case GgufValueType::kI32:
      return static_cast<int64_t>(c.read<int32_t>("i32"));
    case GgufValueType::kF32:
      return static_cast<double>(c.read<float>("f32"));
    case GgufValueType::kU64:
      return c.read<uint64_t>("u64");
    case GgufValueType::kI64:
      return c.read<int64_t>("i64");
    case GgufValueType::kF64:
      return c.read<double>("f64");
    case GgufValueType::kBool: {
      const uint8_t b = c.read<uint8_t>("bool");
      if (b > 1) c.corrupt("bool value " + std::to_string(b) + " is neither 0 nor 1");
      return b == 1;
    }
    case GgufValueType::kString:
      return c.string("string value");
    case GgufValueType::kArray: {
      if (depth > 0) c.corrupt("nested arrays are not supported");
      const uint32_t et = c.read<uint32_t>("array type");
      if (!valid_type(et)) c.corrupt("unknown array element type " + std::to_string(et));
      const uint64_t n = c.read<uint64_t>("array count");
      const auto elem = static_cast<GgufValueType>(et);
      if (n > c.remaining() / min_size(elem))
        c.corrupt("array of " + std::to_string(n) + " elements cannot fit in the " +
                  std::to_string(c.remaining()) + " bytes left");
      auto arr = std::make_shared<GgufArray>();
      arr->elem_type = elem;
      arr->items.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) arr->items.push_back(read_value(c, elem, depth + 1));
      return arr;
    }
  }
  c.corrupt("unknown value type");
}

}  // namespace

void GgufFile::parse() {
  Cursor c(map_->data, map_->size, name_);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != 0x46554747u) c.corrupt("bad magic (not a GGUF file)");
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    c.corrupt("unsupported GGUF version " + std::to_string(version_) + " (2 and 3 are)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Every kv takes at least 8 + 4 + 1 bytes, every tensor info 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.remaining() / 13)
    c.corrupt("metadata count " + std::to_string(n_kv) + " cannot fit in the file");
  if (n_tensors > c.remaining() / 32)
    c.corrupt("tensor count " + std::to_string(n_tensors) + " cannot fit in the file");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string("metadata key");
    const uint32_t t = c.read<uint32_t>("metadata type");
    if (!valid_type(t)) c.corrupt("metadata '" + key + "' has unknown type " + std::to_string(t));
    GgufValue v = read_value(c, static_cast<GgufValueType>(t), 0);
    if (!metadata_.emplace(key, std::move(v)).second) c.corrupt("duplicate metadata key '" + key + "'");
  }
  if (auto it = metadata_.find("general.alignment"); it != metadata_.end()) {
    const auto* a = std::get_if<uint64_t>(&it->second);
    if (!a || *a == 0 || (*a & (*a - 1)) != 0)
      c.corrupt("general.alignment must be a power-of-two unsigned integer");
    alignment_ = *a;
  }

  std::set<std::string> names;
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.string("tensor name");
    if (!names.insert(t.name).second) c.corrupt("duplicate tensor name '" + t.name + "'");
    const uint32_t n_dims = c.read<uint32_t>("tensor n_dims");
    if (n_dims == 0 || n_dims > kMaxDims)
      c.corrupt("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dims (1 to 4 allowed)");
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.read<uint64_t>("tensor dim");
      if (dim == 0 || dim > (uint64_t{1} << 40))
        c.corrupt("tensor '" + t.name + "' has dim " + std::to_string(dim));
      if (__builtin_mul_overflow(n, static_cast<int64_t>(dim), &n))
        c.corrupt("tensor '" + t.name + "' element count overflows");
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    const uint32_t type = c.read<uint32_t>("tensor type");
    t.type = static_cast<GgmlType>(type);
    int64_t be = 0, bb = 0;
    if (!ggml_block(t.type, &be, &bb))
      c.corrupt("tensor '" + t.name + "' has unknown ggml type " + std::to_string(type));
    if (t.dims[0] % be != 0)
      c.corrupt("tensor '" + t.name + "' row of " + std::to_string(t.dims[0]) + " is not a multiple of the " +
                ggml_type_name(t.type) + " block (" + std::to_string(be) + ")");
    t.n_elements = n;
    if (__builtin_mul_overflow(n / be, bb, &t.n_bytes))
      c.corrupt("tensor '" + t.name + "' byte size overflows");
    t.offset = c.read<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0)
      c.corrupt("tensor '" + t.name + "' offset " + std::to_string(t.offset) +
                " is not a multiple of the alignment " + std::to_string(alignment_));
    tensors_.push_back(std::move(t));
  }
  // Tensor data starts at the next multiple of the alignment.
  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (GgufTensor& t : tensors_) {
    uint64_t end;
    if (__builtin_add_overflow(data_start, t.offset, &end) ||
        __builtin_add_overflow(end, static_cast<uint64_t>(t.n_bytes), &end) || end > map_->size)
      core::fail(ErrorCode::kCorruptFile, kOp,
                 "'" + name_ + "': tensor '" + t.name + "' (offset " + std::to_string(t.offset) + ", " +
                     std::to_string(t.n_bytes) + " bytes) lies beyond the end of the file (" +
                     std::to_string(map_->size) + " bytes)");
    t.data = map_->data + data_start + t.offset;
  }
}

// ---------------------------------------------------------------- access

namespace {
[[noreturn]] void missing(const std::string& file, const std::string& key, const char* want) {
  core::fail(ErrorCode::kCorruptFile, kOp,
             "'" + file + "': metadata '" + key + "' is missing or not " + want);
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) missing(name_, key, "a string");
  if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
  missing(name_, key, "a string");
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it != metadata_.end()) {
    if (const auto* u = std::get_if<uint64_t>(&it->second)) return *u;
    if (const auto* i = std::get_if<int64_t>(&it->second); i && *i >= 0) return static_cast<uint64_t>(*i);
  }
  missing(name_, key, "a non-negative integer");
}

double GgufFile::get_float(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it != metadata_.end()) {
    if (const auto* d = std::get_if<double>(&it->second)) return *d;
    if (const auto* u = std::get_if<uint64_t>(&it->second)) return static_cast<double>(*u);
    if (const auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  }
  missing(name_, key, "a number");
}

const GgufArray& GgufFile::get_array(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it != metadata_.end())
    if (const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&it->second)) return **a;
  missing(name_, key, "an array");
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  if (const GgufTensor* t = find_tensor(name)) return *t;
  core::fail(ErrorCode::kCorruptFile, kOp, "'" + name_ + "': tensor '" + name + "' is missing");
}

}  // namespace anchorkv::io
