#include "affine.h"

#include <cstring>

#include "common.h"
#include "float16.h"
#include "tensor_data.h"

namespace example {
namespace {

bool IsStorageType(int type) {
  return type == kInt8 || type == kUint8 || type == kInt4 || type == kUint4 || type == kInt2 || type == kUint2;
}

bool IsFloating(int type) { return type == kFloat || type == kFloat16 || type == kBfloat16 || type == kDouble; }

// The scale/zero_point dims DequantizeLinear requires: scalar per tensor, [dim] per axis, and the
// logical dims with ceil(dim / block) on the axis for blocked quantization.
std::vector<std::int64_t> ParameterShape(const std::vector<std::int64_t>& shape, int axis, std::uint64_t block) {
  if (axis < 0) return {};
  if (block == 0) return {shape[axis]};
  std::vector<std::int64_t> blocked = shape;
  auto dim = static_cast<std::uint64_t>(shape[axis]);
  blocked[axis] = static_cast<std::int64_t>(dim / block + (dim % block ? 1 : 0));
  return blocked;
}

std::string Dims(const std::vector<std::int64_t>& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

// The normalized axis (0 <= axis < rank), or -1 for per-tensor quantization.
int NormalizedAxis(const onnx::AffineLayoutProto& layout, std::size_t rank, const std::string& path) {
  if (!layout.has_axis()) return -1;
  const std::int64_t axis = layout.axis();
  const auto signed_rank = static_cast<std::int64_t>(rank);
  if (axis < -signed_rank || axis >= signed_rank) {
    Fail("AFFINE_AXIS_INVALID", path, "axis " + std::to_string(axis) + " is outside [-" + std::to_string(rank) +
                                          ", " + std::to_string(rank) + ")");
  }
  return static_cast<int>(axis < 0 ? axis + signed_rank : axis);
}

}  // namespace

AffineInfo VerifyAffine(const onnx::EncodedValueProto& value, const Extent& extent, const std::string& path) {
  const onnx::AffineLayoutProto& layout = value.affine();
  const std::string layout_path = path + ".affine";
  if (!IsStorageType(layout.storage_type())) {
    Fail("AFFINE_STORAGE_INVALID", layout_path + ".storage_type",
         "element type " + std::to_string(layout.storage_type()) + " is not INT8/UINT8/INT4/UINT4/INT2/UINT2");
  }
  // logical_type: a tensor of a floating type with concrete dimensions.
  AffineInfo info;
  const std::string logical_path = path + ".logical_type";
  if (!value.has_logical_type() || !value.logical_type().has_tensor_type()) {
    Fail("LOGICAL_TYPE_INVALID", logical_path, "the affine branch needs a tensor type");
  }
  const onnx::TypeProto_Tensor& tensor = value.logical_type().tensor_type();
  if (!IsFloating(tensor.elem_type())) {
    Fail("LOGICAL_TYPE_INVALID", logical_path, "element type " + std::to_string(tensor.elem_type()) +
                                                   " is not a floating type");
  }
  if (!tensor.has_shape()) Fail("LOGICAL_TYPE_INVALID", logical_path, "the affine branch needs concrete dimensions");
  info.element_type = tensor.elem_type();
  info.count = 1;
  for (const onnx::TensorShapeProto_Dimension& dim : tensor.shape().dim()) {
    if (!dim.has_dim_value() || dim.dim_value() < 0) {
      Fail("LOGICAL_TYPE_INVALID", logical_path, "the affine branch needs concrete dimensions");
    }
    info.shape.push_back(dim.dim_value());
  }
  for (std::int64_t dim : info.shape) {
    auto product = CheckedMul(info.count, static_cast<std::uint64_t>(dim));
    if (!product) Fail("SIZE_OVERFLOW", logical_path, "element count overflows uint64");
    info.count = *product;
  }
  // scale: present and floating; its type and the logical element type follow DequantizeLinear.
  if (!layout.has_scale()) Fail("AFFINE_SCALE_INVALID", layout_path, "scale is required");
  const onnx::TensorProto& scale = layout.scale();
  if (!IsFloating(scale.data_type())) {
    Fail("AFFINE_SCALE_INVALID", layout_path + ".scale.data_type",
         "element type " + std::to_string(scale.data_type()) + " is not a floating type");
  }
  // DequantizeLinear's output_dtype (opset 23) lets FLOAT, FLOAT16 and BFLOAT16 scales decode to any of
  // those three (the product is formed in float and rounded once to the output type); a DOUBLE scale
  // decodes to DOUBLE only.
  const bool double_involved = scale.data_type() == kDouble || info.element_type == kDouble;
  if (double_involved && scale.data_type() != info.element_type) {
    Fail("AFFINE_SCALE_INVALID", layout_path + ".scale.data_type",
         "a DOUBLE scale decodes to DOUBLE values only, and only a DOUBLE scale does");
  }
  for (std::int64_t dim : scale.dims()) {
    if (dim < 0) Fail("AFFINE_PARAM_SHAPE", layout_path + ".scale.dims", "negative dimension");
  }
  CheckTensorData(scale, layout_path + ".scale");
  // granularity: axis selects per-axis parameters; block_size is valid only with an axis.
  if (layout.has_block_size() && !layout.has_axis()) {
    Fail("AFFINE_BLOCK_WITHOUT_AXIS", layout_path + ".block_size", "block_size is valid only with an axis");
  }
  const int axis = NormalizedAxis(layout, info.shape.size(), layout_path + ".axis");
  if (layout.has_block_size() && layout.block_size() == 0) {
    Fail("AFFINE_BLOCK_INVALID", layout_path + ".block_size", "block_size must be positive");
  }
  const std::vector<std::int64_t> expected = ParameterShape(info.shape, axis, layout.block_size());
  if (std::vector<std::int64_t>(scale.dims().begin(), scale.dims().end()) != expected) {
    Fail("AFFINE_PARAM_SHAPE", layout_path + ".scale.dims",
         "the scale needs shape " + Dims(expected) + " for this granularity");
  }
  if (layout.has_zero_point()) {
    const onnx::TensorProto& zero_point = layout.zero_point();
    if (zero_point.data_type() != layout.storage_type()) {
      Fail("AFFINE_ZERO_POINT_INVALID", layout_path + ".zero_point.data_type",
           "the zero point's element type differs from storage_type");
    }
    if (std::vector<std::int64_t>(zero_point.dims().begin(), zero_point.dims().end()) != expected) {
      Fail("AFFINE_PARAM_SHAPE", layout_path + ".zero_point.dims",
           "the zero point needs the scale's shape " + Dims(expected));
    }
    CheckTensorData(zero_point, layout_path + ".zero_point");
  }
  // payload: exactly ceil(n * bits / 8) bytes; unused final high bits are zero.
  auto bits = CheckedMul(info.count, static_cast<std::uint64_t>(BitWidth(layout.storage_type())));
  if (!bits) Fail("SIZE_OVERFLOW", logical_path, "code bit count overflows uint64");
  info.code_bits = *bits;
  const std::uint64_t needed = *bits / 8 + (*bits % 8 ? 1 : 0);
  if (extent.length != needed) {
    Fail("AFFINE_PAYLOAD_SIZE", path, std::to_string(info.count) + " codes need exactly " + std::to_string(needed) +
                                          " payload bytes, found " + std::to_string(extent.length));
  }
  const unsigned used = static_cast<unsigned>(*bits % 8);
  if (!extent.external && used && (static_cast<unsigned char>(value.raw_data().back()) >> used)) {
    Fail("AFFINE_PADDING_NONZERO", path + ".raw_data", "unused final high bits must be zero");
  }
  return info;
}

onnx_light::testee::Value DecodeAffine(const onnx::EncodedValueProto& value, const AffineInfo& info,
                                       const Payload& payload, const std::string& path) {
  const onnx::AffineLayoutProto& layout = value.affine();
  if (info.count > kMaxDecodedElements) {
    Fail("RESOURCE_LIMIT", path, std::to_string(info.count) + " logical elements exceed this runtime's limit");
  }
  const unsigned used = static_cast<unsigned>(info.code_bits % 8);
  if (used && payload.size && (payload.data[payload.size - 1] >> used)) {  // external payloads: checked on read
    Fail("AFFINE_PADDING_NONZERO", path, "unused final high bits must be zero");
  }
  const std::vector<double> scales = ReadFloating(layout.scale());
  std::vector<std::int64_t> zero_points(scales.size(), 0);
  if (layout.has_zero_point()) zero_points = ReadIntegers(layout.zero_point());

  // Element i has coordinate (i / inner) % dim on the axis; its parameter index follows the parameter
  // shape: the coordinate per axis, coordinate / block for blocked, 0 per tensor.
  const int axis = NormalizedAxis(layout, info.shape.size(), path + ".affine.axis");
  std::uint64_t inner = 1, dim = 1, blocks = 1, block = 1;
  if (axis >= 0) {
    for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < info.shape.size(); ++d) inner *= info.shape[d];
    dim = static_cast<std::uint64_t>(info.shape[axis]);
    block = layout.has_block_size() ? layout.block_size() : 1;
    blocks = dim / block + (dim % block ? 1 : 0);
  }
  auto parameter = [&](std::uint64_t i) -> std::uint64_t {
    if (axis < 0) return 0;
    const std::uint64_t coordinate = (i / inner) % dim;
    if (!layout.has_block_size()) return coordinate;
    const std::uint64_t outer = i / (inner * dim);
    return (outer * blocks + coordinate / block) * inner + i % inner;
  };

  const int storage = layout.storage_type();
  const int width = BitWidth(storage);
  const bool is_signed = storage == kInt8 || storage == kInt4 || storage == kInt2;
  const std::string dtype = info.element_type == kFloat     ? "float32"
                            : info.element_type == kDouble  ? "float64"
                            : info.element_type == kFloat16 ? "float16"
                                                            : "bfloat16";
  const std::size_t item = info.element_type == kFloat ? 4 : info.element_type == kDouble ? 8 : 2;
  std::vector<std::uint8_t> out(info.count * item);
  for (std::uint64_t i = 0; i < info.count; ++i) {
    const std::int64_t code = UnpackCode(payload.data, i, width, is_signed);
    const std::uint64_t p = parameter(i);
    std::uint8_t* slot = out.data() + i * item;
    if (info.element_type == kDouble) {  // DequantizeLinear computes in the scale's precision
      const double decoded = static_cast<double>(code - zero_points[p]) * scales[p];
      std::memcpy(slot, &decoded, sizeof decoded);
      continue;
    }
    const float decoded = static_cast<float>(code - zero_points[p]) * static_cast<float>(scales[p]);
    if (info.element_type == kFloat) {
      std::memcpy(slot, &decoded, sizeof decoded);
    } else {
      const std::uint16_t bits = info.element_type == kFloat16 ? FloatToHalf(decoded) : FloatToBfloat16(decoded);
      std::memcpy(slot, &bits, sizeof bits);
    }
  }
  return onnx_light::testee::Value::Tensor(dtype, info.shape, std::move(out));
}

}  // namespace example
