// TensorProto values used as parameters (affine scales and zero points) and struct constants: the
// ONNX storage rules (one data field, sized to the dims) and reading them back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "onnx-light.pb.h"

namespace example {

// Exactly one inline data representation whose size matches the dims (TENSOR_DATA_INVALID otherwise;
// SIZE_OVERFLOW when the element count overflows). Returns the element count.
std::uint64_t CheckTensorData(const onnx::TensorProto& tensor, const std::string& path);

// The values of a checked FLOAT, FLOAT16, BFLOAT16 or DOUBLE tensor (each exact in a double).
std::vector<double> ReadFloating(const onnx::TensorProto& tensor);

// The values of a checked INT8, UINT8, INT4, UINT4, INT2, UINT2 or INT64 tensor.
std::vector<std::int64_t> ReadIntegers(const onnx::TensorProto& tensor);

// Code `index` of a packed payload of `width`-bit codes (least-significant bits first).
inline std::int64_t UnpackCode(const std::uint8_t* bytes, std::uint64_t index, int width, bool is_signed) {
  if (width == 8) return is_signed ? static_cast<std::int8_t>(bytes[index]) : bytes[index];
  std::uint64_t bit = index * static_cast<std::uint64_t>(width);
  std::int64_t code = (bytes[bit / 8] >> (bit % 8)) & ((1 << width) - 1);
  if (is_signed && code >= (1 << (width - 1))) code -= (1 << width);
  return code;
}

}  // namespace example
