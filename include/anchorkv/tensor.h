// Tensors at the API boundary.
//
// TensorView: a non-owning, read-only view of caller memory shaped
// [B, H, S, D] with per-dimension strides counted in elements (so
// non-contiguous data, e.g. a transposed numpy array, is read without a copy).
// Supported element types: f32, f16 (IEEE binary16 bits), bf16 (bits).
//
// Tensor: a small owning, contiguous row-major [B, H, S, D] tensor; the caches
// return fp16 Tensors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace anchorkv {

enum class DType : uint8_t { kF32, kF16, kBF16 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

using Shape4 = std::array<int64_t, 4>;  // [B, H, S, D]

std::string shape_string(const Shape4& shape);

// IEEE binary16 <-> binary32, round to nearest even (NaN stays NaN, values
// beyond the fp16 range become +-Inf).
float fp16_to_f32(uint16_t bits);
uint16_t f32_to_fp16(float value);
float bf16_to_f32(uint16_t bits);

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  Shape4 shape{0, 0, 0, 0};
  Shape4 strides{0, 0, 0, 0};  // in elements, may be any non-negative value

  // Row-major contiguous view of `data` (caller keeps ownership).
  static TensorView contiguous(const void* data, DType dtype, const Shape4& shape);
  static TensorView f32(const float* data, const Shape4& shape) {
    return contiguous(data, DType::kF32, shape);
  }
  static TensorView f16(const uint16_t* data, const Shape4& shape) {
    return contiguous(data, DType::kF16, shape);
  }
  static TensorView bf16(const uint16_t* data, const Shape4& shape) {
    return contiguous(data, DType::kBF16, shape);
  }

  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  bool is_contiguous() const;
  // Element (b, h, s, d) converted to f32. No bounds check.
  float at(int64_t b, int64_t h, int64_t s, int64_t d) const;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, const Shape4& shape);  // zero-filled

  DType dtype() const { return dtype_; }
  const Shape4& shape() const { return shape_; }
  int64_t numel() const { return shape_[0] * shape_[1] * shape_[2] * shape_[3]; }
  size_t nbytes() const { return storage_.size(); }
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  template <class T>
  T* data_as() { return reinterpret_cast<T*>(storage_.data()); }
  template <class T>
  const T* data_as() const { return reinterpret_cast<const T*>(storage_.data()); }

  TensorView view() const;
  float at(int64_t b, int64_t h, int64_t s, int64_t d) const { return view().at(b, h, s, d); }
  std::vector<float> to_f32() const;  // all elements, row-major

 private:
  DType dtype_ = DType::kF32;
  Shape4 shape_{0, 0, 0, 0};
  std::vector<std::byte> storage_;
};

}  // namespace anchorkv
