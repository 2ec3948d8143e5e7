#include <string>

#include "anchorkv/tensor.h"
#include "core/error.h"
#include "core/half.h"

namespace anchorkv {

size_t dtype_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
  }
  return "?";
}

std::string shape_string(const Shape4& s) {
  std::string out = "[";
  for (int i = 0; i < 4; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(s[i]);
  }
  out += ']';
  return out;
}

TensorView TensorView::contiguous(const void* data, DType dtype, const Shape4& shape) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.shape = shape;
  v.strides = {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1};
  return v;
}

bool TensorView::is_contiguous() const {
  return strides[3] == 1 && strides[2] == shape[3] && strides[1] == shape[2] * shape[3] &&
         strides[0] == shape[1] * shape[2] * shape[3];
}

float TensorView::at(int64_t b, int64_t h, int64_t s, int64_t d) const {
  const int64_t i = b * strides[0] + h * strides[1] + s * strides[2] + d * strides[3];
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return core::half_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return core::bf16_to_float(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

Tensor::Tensor(DType dtype, const Shape4& shape) : dtype_(dtype), shape_(shape) {
  for (int64_t x : shape) {
    if (x < 0) core::fail(ErrorCode::kInvalidArgument, "anchorkv::Tensor", "negative dimension in " + shape_string(shape));
  }
  storage_.resize(static_cast<size_t>(numel()) * dtype_size(dtype));
}

TensorView Tensor::view() const { return TensorView::contiguous(storage_.data(), dtype_, shape_); }

std::vector<float> Tensor::to_f32() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  const TensorView v = view();
  int64_t i = 0;
  for (int64_t b = 0; b < shape_[0]; ++b)
    for (int64_t h = 0; h < shape_[1]; ++h)
      for (int64_t s = 0; s < shape_[2]; ++s)
        for (int64_t d = 0; d < shape_[3]; ++d) out[i++] = v.at(b, h, s, d);
  return out;
}

}  // namespace anchorkv
