// Little-endian byte encoding of cache state (the cache-file format,
// docs/cachefile.md). The reader checks every length against the bytes left
// before it allocates, and its errors name the file, the section and the field.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"

namespace anchorkv::cache {

static_assert(std::endian::native == std::endian::little, "the cache-file format is little-endian");

class ByteWriter {
 public:
  template <class T>
  void put(T x) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  // u64 count, then the elements as stored.
  template <class T>
  void array(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(v.size());
    if (v.empty()) return;
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size() * sizeof(T));
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class ByteReader {
 public:
  // context: where the bytes come from, e.g. "'a.akvc', section 'layer 3'".
  ByteReader(const uint8_t* data, size_t size, std::string op, std::string context)
      : p_(data), left_(size), op_(std::move(op)), context_(std::move(context)) {}

  [[noreturn]] void fail(const char* field, const std::string& why) const {
    core::fail(ErrorCode::kCorruptFile, op_, context_ + ", field '" + field + "': " + why);
  }
  // The cache-file format version being read (fields added later are read only from newer files).
  uint32_t format_version() const { return version_; }
  void set_format_version(uint32_t v) { version_ = v; }
  template <class T>
  T get(const char* field) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (left_ < sizeof(T)) fail(field, "the section ends early");
    T x;
    std::memcpy(&x, p_, sizeof(T));
    p_ += sizeof(T);
    left_ -= sizeof(T);
    return x;
  }
  bool flag(const char* field) {
    const uint8_t b = get<uint8_t>(field);
    if (b > 1) fail(field, "a flag must be 0 or 1, got " + std::to_string(b));
    return b == 1;
  }
  std::string str(const char* field, uint64_t max_len = 4096) {
    const uint64_t n = get<uint64_t>(field);
    if (n > max_len || n > left_) fail(field, "string length " + std::to_string(n) + " is too long");
    std::string s(reinterpret_cast<const char*>(p_), static_cast<size_t>(n));
    p_ += n;
    left_ -= n;
    return s;
  }
  // A u64 count then the elements; the count must equal `expected` and fit in
  // the bytes left (checked before anything is allocated).
  template <class T>
  std::vector<T> array(const char* field, uint64_t expected) {
    const uint64_t n = get<uint64_t>(field);
    if (n != expected)
      fail(field, "holds " + std::to_string(n) + " elements, expected " + std::to_string(expected));
    return take<T>(field, n);
  }
  // The same when the count is free (bounded by the bytes left).
  template <class T>
  std::vector<T> array_any(const char* field) {
    return take<T>(field, get<uint64_t>(field));
  }
  // Stored values (fp16 bits, f32): the same, and each must be finite. A
  // non-finite K, V, scale or coefficient would turn every attention over
  // the cache into NaN, long after the file was accepted.
  std::vector<uint16_t> halves(const char* field, uint64_t expected) {
    return finite_halves(field, array<uint16_t>(field, expected));
  }
  std::vector<uint16_t> halves_any(const char* field) { return finite_halves(field, array_any<uint16_t>(field)); }
  std::vector<float> floats(const char* field, uint64_t expected) {
    return finite_floats(field, array<float>(field, expected));
  }
  std::vector<float> floats_any(const char* field) { return finite_floats(field, array_any<float>(field)); }
  void expect_end(const char* field) const {
    if (left_ != 0) fail(field, std::to_string(left_) + " unread bytes at the end of the section");
  }
  size_t left() const { return left_; }

 private:
  std::vector<uint16_t> finite_halves(const char* field, std::vector<uint16_t> v) const {
    for (size_t i = 0; i < v.size(); ++i)
      if ((v[i] & 0x7C00) == 0x7C00) fail(field, "value " + std::to_string(i) + " is not finite");
    return v;
  }
  std::vector<float> finite_floats(const char* field, std::vector<float> v) const {
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i])) fail(field, "value " + std::to_string(i) + " is not finite");
    return v;
  }
  template <class T>
  std::vector<T> take(const char* field, uint64_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > left_ / sizeof(T)) fail(field, std::to_string(n) + " elements do not fit in the section");
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), p_, static_cast<size_t>(n) * sizeof(T));
    p_ += n * sizeof(T);
    left_ -= n * sizeof(T);
    return v;
  }

  const uint8_t* p_;
  size_t left_;
  std::string op_, context_;
  uint32_t version_ = 0;
};

}  // namespace anchorkv::cache
