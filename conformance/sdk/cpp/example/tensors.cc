#include "tensors.h"

#include <cmath>
#include <cstring>

#include "common.h"

namespace example {

using onnx_light::testee::Value;

namespace {

constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 26;

[[noreturn]] void ExecutionFailed(const std::string& what, const std::string& message) {
  Fail("EXECUTION_FAILED", what, message);
}

float HalfBitsToFloat(std::uint16_t bits) {
  _Float16 half;
  std::memcpy(&half, &bits, 2);
  return half;
}

std::uint16_t FloatToHalfBits(float value) {
  _Float16 half = value;
  std::uint16_t bits;
  std::memcpy(&bits, &half, 2);
  return bits;
}

template <typename T>
double Load(const std::uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return static_cast<double>(value);
}

template <typename T>
void Store(std::uint8_t* at, double value) {
  const T converted = static_cast<T>(value);
  std::memcpy(at, &converted, sizeof(T));
}

double LoadAs(const std::string& dtype, const std::uint8_t* at) {
  if (dtype == "float32") return Load<float>(at);
  if (dtype == "float64") return Load<double>(at);
  if (dtype == "int64") return Load<std::int64_t>(at);
  if (dtype == "int32") return Load<std::int32_t>(at);
  if (dtype == "int16") return Load<std::int16_t>(at);
  if (dtype == "int8") return Load<std::int8_t>(at);
  if (dtype == "uint8") return Load<std::uint8_t>(at);
  if (dtype == "uint16") return Load<std::uint16_t>(at);
  if (dtype == "uint32") return Load<std::uint32_t>(at);
  if (dtype == "uint64") return Load<std::uint64_t>(at);
  if (dtype == "bool") return *at != 0;
  if (dtype == "float16") {
    std::uint16_t bits;
    std::memcpy(&bits, at, 2);
    return HalfBitsToFloat(bits);
  }
  return NAN;
}

void StoreAs(const std::string& dtype, std::uint8_t* at, double value) {
  if (dtype == "float32") return Store<float>(at, value);
  if (dtype == "float64") return Store<double>(at, value);
  if (dtype == "bool") {
    *at = value != 0;
    return;
  }
  if (dtype == "float16") {
    const std::uint16_t bits = FloatToHalfBits(static_cast<float>(value));
    std::memcpy(at, &bits, 2);
    return;
  }
  // Integers: a value outside the type's range has no defined conversion; keep it defined (wrap via int64).
  const std::int64_t whole = std::isfinite(value) && std::fabs(value) < 9.2e18 ? ToInt64(value) : 0;
  if (dtype == "int64") {
    std::memcpy(at, &whole, 8);
    return;
  }
  if (dtype == "int32") return Store<std::int32_t>(at, static_cast<double>(static_cast<std::int32_t>(whole)));
  if (dtype == "int16") return Store<std::int16_t>(at, static_cast<double>(static_cast<std::int16_t>(whole)));
  if (dtype == "int8") return Store<std::int8_t>(at, static_cast<double>(static_cast<std::int8_t>(whole)));
  if (dtype == "uint8") return Store<std::uint8_t>(at, static_cast<double>(static_cast<std::uint8_t>(whole)));
  if (dtype == "uint16") return Store<std::uint16_t>(at, static_cast<double>(static_cast<std::uint16_t>(whole)));
  if (dtype == "uint32") return Store<std::uint32_t>(at, static_cast<double>(static_cast<std::uint32_t>(whole)));
  if (dtype == "uint64") {
    const auto bits = static_cast<std::uint64_t>(whole);
    std::memcpy(at, &bits, 8);
  }
}

bool Numeric(const std::string& dtype) {
  return dtype != "bfloat16" && onnx_light::testee::ItemSize(dtype) != 0;
}

}  // namespace

std::string DtypeName(int elem_type) {
  switch (elem_type) {
    case 1: return "float32";
    case 2: return "uint8";
    case 3: return "int8";
    case 4: return "uint16";
    case 5: return "int16";
    case 6: return "int32";
    case 7: return "int64";
    case 9: return "bool";
    case 10: return "float16";
    case 11: return "float64";
    case 12: return "uint32";
    case 13: return "uint64";
    case 16: return "bfloat16";
    default: return "";
  }
}

std::uint64_t ElementCount(const std::vector<std::int64_t>& shape, const std::string& what) {
  std::uint64_t count = 1;
  for (std::int64_t dim : shape) {
    if (dim < 0) ExecutionFailed(what, "a negative dimension");
    const auto product = CheckedMul(count, static_cast<std::uint64_t>(dim));
    if (!product || *product > kMaxElements) Fail("RESOURCE_LIMIT", what, "more elements than this executor holds");
    count = *product;
  }
  return count;
}

std::vector<double> ReadNumbers(const Value& tensor, const std::string& what) {
  if (tensor.kind != Value::Kind::kTensor || !Numeric(tensor.dtype)) {
    ExecutionFailed(what, "a numeric tensor is required");
  }
  const std::uint64_t count = ElementCount(tensor.shape, what);
  const std::size_t item = onnx_light::testee::ItemSize(tensor.dtype);
  std::vector<double> out(count);
  if (count == 0) return out;
  const std::size_t rank = tensor.shape.size();
  for (std::uint64_t i = 0; i < count; ++i) {
    std::uint64_t offset = i;  // in elements
    if (!tensor.strides.empty()) {
      offset = 0;
      std::uint64_t rest = i;
      for (std::size_t d = rank; d-- > 0;) {
        const auto dim = static_cast<std::uint64_t>(tensor.shape[d]);
        offset += (rest % dim) * static_cast<std::uint64_t>(tensor.strides[d]);
        rest /= dim;
      }
    }
    if ((offset + 1) * item > tensor.size) ExecutionFailed(what, "the tensor's data is shorter than its shape");
    out[i] = LoadAs(tensor.dtype, tensor.data + offset * item);
  }
  return out;
}

Value MakeTensor(const std::string& dtype, std::vector<std::int64_t> shape, const std::vector<double>& values) {
  const std::size_t item = onnx_light::testee::ItemSize(dtype);
  if (!Numeric(dtype)) ExecutionFailed("result", "no numeric dtype " + dtype);
  std::vector<std::uint8_t> bytes(values.size() * item);
  for (std::size_t i = 0; i < values.size(); ++i) StoreAs(dtype, bytes.data() + i * item, values[i]);
  return Value::Tensor(dtype, std::move(shape), std::move(bytes));
}

std::vector<std::int64_t> Broadcast(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                                    const std::string& what) {
  const std::size_t rank = std::max(a.size(), b.size());
  std::vector<std::int64_t> out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t x = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
    const std::int64_t y = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
    if (x != y && x != 1 && y != 1) ExecutionFailed(what, "shapes do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

std::uint64_t BroadcastIndex(std::uint64_t index, const std::vector<std::int64_t>& out,
                             const std::vector<std::int64_t>& shape) {
  std::uint64_t result = 0, stride = 1;
  for (std::size_t d = out.size(); d-- > 0;) {
    const auto coordinate = index % static_cast<std::uint64_t>(out[d]);
    index /= static_cast<std::uint64_t>(out[d]);
    const std::size_t offset = out.size() - shape.size();
    if (d < offset) continue;
    const auto dim = static_cast<std::uint64_t>(shape[d - offset]);
    if (dim != 1) result += coordinate * stride;
    stride *= dim;
  }
  return result;
}

Value TensorFromProto(const onnx::TensorProto& tensor, const std::string& path) {
  if (tensor.data_type() == kString) {  // ONNX strings are bytes; UTF-8 ones travel as text
    std::vector<std::int64_t> dims(tensor.dims().begin(), tensor.dims().end());
    if (ElementCount(dims, path) != static_cast<std::uint64_t>(tensor.string_data_size())) {
      Fail("TENSOR_DATA_INVALID", path, "string_data does not fit dims");
    }
    Value text;
    text.kind = Value::Kind::kTensor;
    text.dtype = "str";
    text.shape = dims;
    for (const std::string& item : tensor.string_data()) {
      if (!onnx_light::testee::IsValidUtf8(item)) text.dtype = "bytes";
      text.strings.push_back(item);
    }
    return text;
  }
  const std::string dtype = DtypeName(tensor.data_type());
  if (dtype.empty() || dtype == "bfloat16") Unsupported(path, "element type " + std::to_string(tensor.data_type()));
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL) Unsupported(path, "external dense tensors");
  std::vector<std::int64_t> shape(tensor.dims().begin(), tensor.dims().end());
  const std::uint64_t count = ElementCount(shape, path);
  const std::size_t item = onnx_light::testee::ItemSize(dtype);
  if (tensor.has_raw_data()) {
    if (tensor.raw_data().size() != count * item) Fail("TENSOR_DATA_INVALID", path, "raw_data does not fit dims");
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(tensor.raw_data().data());
    return Value::Tensor(dtype, shape, std::vector<std::uint8_t>(bytes, bytes + tensor.raw_data().size()));
  }
  std::vector<double> values;
  if (tensor.float_data_size()) values.assign(tensor.float_data().begin(), tensor.float_data().end());
  else if (tensor.double_data_size()) values.assign(tensor.double_data().begin(), tensor.double_data().end());
  else if (tensor.int64_data_size()) values.assign(tensor.int64_data().begin(), tensor.int64_data().end());
  else if (tensor.uint64_data_size()) values.assign(tensor.uint64_data().begin(), tensor.uint64_data().end());
  else if (tensor.int32_data_size() && dtype != "float16") values.assign(tensor.int32_data().begin(), tensor.int32_data().end());
  else if (tensor.int32_data_size()) {
    for (std::int32_t bits : tensor.int32_data()) values.push_back(HalfBitsToFloat(static_cast<std::uint16_t>(bits)));
  }
  if (values.size() != count) Fail("TENSOR_DATA_INVALID", path, "the data does not fit dims");
  return MakeTensor(dtype, shape, values);
}

std::int64_t ToInt64(double value) {
  if (std::isnan(value)) return 0;
  if (value >= 9223372036854775807.0) return INT64_MAX;
  if (value <= -9223372036854775808.0) return INT64_MIN;
  return static_cast<std::int64_t>(value);
}

std::vector<std::int64_t> ReadIndices(const Value& tensor, const std::string& what) {
  if (tensor.kind != Value::Kind::kTensor || (tensor.dtype != "int64" && tensor.dtype != "int32")) {
    ExecutionFailed(what, "an integer tensor is required");
  }
  std::vector<std::int64_t> out;
  for (double value : ReadNumbers(tensor, what)) out.push_back(ToInt64(value));
  return out;
}

}  // namespace example
