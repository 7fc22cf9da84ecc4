// Shared vocabulary of the example runtime: verdicts with a path, element types, checked arithmetic.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "onnx_light_testee/sdk.h"

namespace example {

// TensorProto.DataType numbers used here.
enum DataType : int {
  kFloat = 1, kUint8 = 2, kInt8 = 3, kInt64 = 7, kString = 8, kFloat16 = 10, kDouble = 11,
  kBfloat16 = 16, kUint4 = 21, kInt4 = 22, kUint2 = 25, kInt2 = 26,
};

// Decoded elements this runtime materializes for one value; larger values fail with RESOURCE_LIMIT.
inline constexpr std::uint64_t kMaxDecodedElements = std::uint64_t{1} << 28;

// A rejection with the suite's code; the message starts with the path of the offending object.
[[noreturn]] inline void Fail(const char* code, const std::string& path, const std::string& message) {
  throw onnx_light::testee::Rejected(code, path + ": " + message);
}

// Something this runtime does not implement (its own verdict, never a failure).
[[noreturn]] inline void Unsupported(const std::string& path, const std::string& what) {
  throw onnx_light::testee::NotSupported(path + ": " + what);
}

// Bit width of a fixed-width element type, 0 for STRING, UNDEFINED and numbers ONNX does not define.
int BitWidth(int data_type);

inline std::optional<std::uint64_t> CheckedMul(std::uint64_t a, std::uint64_t b) {
  std::uint64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

inline std::optional<std::uint64_t> CheckedAdd(std::uint64_t a, std::uint64_t b) {
  std::uint64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

}  // namespace example
