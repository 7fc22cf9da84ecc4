#include "tensor_data.h"

#include <cstring>

#include "common.h"
#include "float16.h"

namespace example {
namespace {

enum class Field { kFloat, kInt32, kString, kInt64, kDouble, kUint64 };

// Where ONNX stores typed (non-raw) values of an element type.
Field TypedField(int type) {
  switch (type) {
    case kFloat: case 14 /* COMPLEX64 */: return Field::kFloat;
    case kDouble: case 15 /* COMPLEX128 */: return Field::kDouble;
    case kInt64: return Field::kInt64;
    case 12 /* UINT32 */: case 13 /* UINT64 */: return Field::kUint64;
    case kString: return Field::kString;
    default: return Field::kInt32;
  }
}

int FieldSize(const onnx::TensorProto& tensor, Field field) {
  switch (field) {
    case Field::kFloat: return tensor.float_data_size();
    case Field::kInt32: return tensor.int32_data_size();
    case Field::kString: return tensor.string_data_size();
    case Field::kInt64: return tensor.int64_data_size();
    case Field::kDouble: return tensor.double_data_size();
    case Field::kUint64: return tensor.uint64_data_size();
  }
  return 0;
}

// Codes per int32_data entry for the packed sub-byte types, else 1.
int CodesPerEntry(int type) {
  switch (type) {
    case kUint4: case kInt4: case 23 /* FLOAT4E2M1 */: return 2;
    case kUint2: case kInt2: return 4;
    default: return 1;
  }
}

template <typename T>
T LittleEndian(const std::string& raw, std::uint64_t index) {
  T value;
  std::memcpy(&value, raw.data() + index * sizeof(T), sizeof(T));
  return value;
}

}  // namespace

int BitWidth(int type) {
  static const int kWidths[] = {0, 32, 8, 8, 16, 16, 32, 64, 0, 8, 16, 64, 32, 64, 64,
                                128, 16, 8, 8, 8, 8, 4, 4, 4, 8, 2, 2, 6, 6};
  return type >= 0 && type < static_cast<int>(sizeof kWidths / sizeof kWidths[0]) ? kWidths[type] : 0;
}

std::uint64_t CheckTensorData(const onnx::TensorProto& tensor, const std::string& path) {
  const int type = tensor.data_type();
  if (BitWidth(type) == 0 && type != kString) {
    Fail("TENSOR_DATA_INVALID", path + ".data_type", "element type " + std::to_string(type) + " is not defined");
  }
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL || tensor.external_data_size() > 0) {
    Fail("TENSOR_DATA_INVALID", path, "an inline tensor value is required, not external data");
  }
  if (tensor.has_segment()) Fail("TENSOR_DATA_INVALID", path + ".segment", "segmented tensors are not values");
  std::uint64_t count = 1;
  for (std::int64_t dim : tensor.dims()) {
    auto product = CheckedMul(count, static_cast<std::uint64_t>(dim));
    if (!product) Fail("SIZE_OVERFLOW", path + ".dims", "element count overflows uint64");
    count = *product;
  }
  const Field fields[] = {Field::kFloat, Field::kInt32, Field::kString, Field::kInt64, Field::kDouble,
                          Field::kUint64};
  int populated = 0;
  Field first = Field::kFloat;
  for (Field field : fields) {
    if (FieldSize(tensor, field) > 0 && populated++ == 0) first = field;
  }
  if (tensor.has_raw_data() && type == kString) {
    Fail("TENSOR_DATA_INVALID", path + ".raw_data", "string tensors cannot use raw_data");
  }
  if (populated + (tensor.has_raw_data() ? 1 : 0) > 1) {
    Fail("TENSOR_DATA_INVALID", path, "tensor data is stored in more than one field");
  }
  if (tensor.has_raw_data()) {
    auto bits = CheckedMul(count, static_cast<std::uint64_t>(BitWidth(type)));
    if (!bits || *bits / 8 + (*bits % 8 ? 1 : 0) != tensor.raw_data().size()) {
      Fail("TENSOR_DATA_INVALID", path + ".raw_data",
           std::to_string(tensor.raw_data().size()) + " bytes do not hold " + std::to_string(count) + " elements");
    }
    return count;
  }
  const Field expected_field = TypedField(type);
  if (populated && first != expected_field) {
    Fail("TENSOR_DATA_INVALID", path, "the values are not in the field this element type uses");
  }
  std::uint64_t expected = count;
  if (type == 14 || type == 15) expected = count > UINT64_MAX / 2 ? 0 : count * 2;  // complex: pairs
  int per_entry = CodesPerEntry(type);
  if (per_entry > 1) expected = count / per_entry + (count % per_entry ? 1 : 0);
  if (static_cast<std::uint64_t>(FieldSize(tensor, expected_field)) != expected) {
    Fail("TENSOR_DATA_INVALID", path,
         std::to_string(FieldSize(tensor, expected_field)) + " values for " + std::to_string(count) + " elements");
  }
  return count;
}

std::vector<double> ReadFloating(const onnx::TensorProto& tensor) {
  std::uint64_t count = 1;
  for (std::int64_t dim : tensor.dims()) count *= static_cast<std::uint64_t>(dim);
  std::vector<double> values(count);
  const bool raw = tensor.has_raw_data();
  for (std::uint64_t i = 0; i < count; ++i) {
    switch (tensor.data_type()) {
      case kFloat:
        values[i] = raw ? LittleEndian<float>(tensor.raw_data(), i) : tensor.float_data(static_cast<int>(i));
        break;
      case kDouble:
        values[i] = raw ? LittleEndian<double>(tensor.raw_data(), i) : tensor.double_data(static_cast<int>(i));
        break;
      case kFloat16:
      case kBfloat16: {
        auto bits = raw ? LittleEndian<std::uint16_t>(tensor.raw_data(), i)
                        : static_cast<std::uint16_t>(tensor.int32_data(static_cast<int>(i)));
        values[i] = tensor.data_type() == kFloat16 ? HalfToFloat(bits) : Bfloat16ToFloat(bits);
        break;
      }
      default:
        values[i] = 0;
    }
  }
  return values;
}

std::vector<std::int64_t> ReadIntegers(const onnx::TensorProto& tensor) {
  std::uint64_t count = 1;
  for (std::int64_t dim : tensor.dims()) count *= static_cast<std::uint64_t>(dim);
  std::vector<std::int64_t> values(count);
  const int type = tensor.data_type();
  const bool raw = tensor.has_raw_data();
  if (type == kInt64) {
    for (std::uint64_t i = 0; i < count; ++i) {
      values[i] = raw ? LittleEndian<std::int64_t>(tensor.raw_data(), i) : tensor.int64_data(static_cast<int>(i));
    }
    return values;
  }
  const int width = BitWidth(type);
  const bool is_signed = type == kInt8 || type == kInt4 || type == kInt2;
  // Typed storage keeps one byte of codes per int32_data entry (the low byte, as a wrapping cast).
  std::string bytes;
  if (raw) {
    bytes = tensor.raw_data();
  } else {
    for (std::int32_t entry : tensor.int32_data()) bytes.push_back(static_cast<char>(entry & 0xFF));
  }
  for (std::uint64_t i = 0; i < count; ++i) {
    values[i] = UnpackCode(reinterpret_cast<const std::uint8_t*>(bytes.data()), i, width, is_signed);
  }
  return values;
}

}  // namespace example
