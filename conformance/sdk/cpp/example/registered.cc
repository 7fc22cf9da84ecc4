#include "registered.h"

#include <cstring>
#include <vector>

#include "common.h"
#include "tensor_data.h"

namespace example {
namespace {

// ------------------------------------------------------------------------------ layout signature

// Flattens a record: every scalar leaf as path:type/width@bit-offset with its (count, stride) dims,
// outermost first; constants as path:type[dims]=little-endian bytes. A node budget keeps a hostile
// declaration from expanding: a layout this large is no registered one.
class Flattener {
 public:
  explicit Flattener(const Catalogue& catalogue) : catalogue_(catalogue) {}

  bool Struct(const onnx::StructTypeProto& st, const std::string& prefix, std::uint64_t offset,
              const std::string& dims, const std::string& path) {
    if (++visited_ > kMaxNodes) return false;
    const onnx::StructTypeProto& resolved =
        st.has_type_ref() ? catalogue_.Lookup(st.type_ref(), path + ".type_ref") : st;
    if (resolved.has_array()) {
      BitSize element = catalogue_.TypeBits(resolved.array().element_type(), path, 0);
      return element.fixed && Type(resolved.array().element_type(), prefix, offset,
                                   dims + Dim(resolved.array().dimension(), element.bits), path);
    }
    if (resolved.has_bit_packing()) {
      std::uint64_t stride = 0;
      for (const auto& component : resolved.bit_packing().component()) stride += component.bit_width();
      std::uint64_t running = 0;
      for (const auto& component : resolved.bit_packing().component()) {
        leaves_ += Join(prefix, component.name()) + ":bits/" + std::to_string(component.bit_width()) + "@" +
                   std::to_string(offset + running) + dims + Dim(resolved.bit_packing().dimension(), stride) + ";";
        running += component.bit_width();
      }
      return true;
    }
    std::uint64_t running = 0;
    for (const auto& field : resolved.structure().field()) {
      const std::string name = Join(prefix, field.name());
      if (field.has_constant()) {
        constants_ += name + ":" + Constant(field.constant()) + ";";
        continue;
      }
      if (!Type(field.type(), name, offset + running, dims, path)) return false;
      BitSize size = catalogue_.TypeBits(field.type(), path, 0);
      if (!size.fixed) return false;
      running += size.bits;
    }
    return true;
  }

  std::string Signature(std::uint64_t record_bits) const {
    return "record=" + std::to_string(record_bits) + ";" + leaves_ + "|" + constants_;
  }

 private:
  static constexpr int kMaxNodes = 256;

  bool Type(const onnx::TypeProto& type, const std::string& prefix, std::uint64_t offset, const std::string& dims,
            const std::string& path) {
    if (++visited_ > kMaxNodes) return false;
    if (type.has_struct_type()) return Struct(type.struct_type(), prefix, offset, dims, path);
    const auto& tensor = type.tensor_type();
    const int width = BitWidth(tensor.elem_type());
    std::vector<std::uint64_t> shape;
    for (const auto& dim : tensor.shape().dim()) shape.push_back(static_cast<std::uint64_t>(dim.dim_value()));
    std::vector<std::uint64_t> strides(shape.size());
    std::uint64_t stride = static_cast<std::uint64_t>(width);
    for (std::size_t i = shape.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= shape[i];
    }
    std::string tensor_dims;
    for (std::size_t i = 0; i < shape.size(); ++i) tensor_dims += Dim(shape[i], strides[i]);
    leaves_ += prefix + ":" + std::to_string(tensor.elem_type()) + "/" + std::to_string(width) + "@" +
               std::to_string(offset) + dims + tensor_dims + ";";
    return true;
  }

  static std::string Join(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "." + name;
  }

  static std::string Dim(std::uint64_t count, std::uint64_t stride) {
    return "[" + std::to_string(count) + "x" + std::to_string(stride) + "]";
  }

  // FLOAT and INT64 constants (the only ones registered layouts hold) by value; others by type alone,
  // which is enough to tell them apart from every registration.
  static std::string Constant(const onnx::TensorProto& tensor) {
    std::string text = std::to_string(tensor.data_type()) + "[";
    for (std::int64_t dim : tensor.dims()) text += std::to_string(dim) + ",";
    text += "]=";
    static const char kHex[] = "0123456789abcdef";
    auto hex = [&](const void* data, std::size_t size) {
      for (std::size_t i = 0; i < size; ++i) {
        auto byte = static_cast<const unsigned char*>(data)[i];
        text += kHex[byte >> 4];
        text += kHex[byte & 15];
      }
    };
    if (tensor.has_raw_data()) {
      hex(tensor.raw_data().data(), tensor.raw_data().size());
    } else if (tensor.data_type() == kFloat) {
      for (float value : tensor.float_data()) hex(&value, sizeof value);
    } else if (tensor.data_type() == kInt64) {
      for (std::int64_t value : tensor.int64_data()) hex(&value, sizeof value);
    } else {
      text += "?";
    }
    return text;
  }

  const Catalogue& catalogue_;
  int visited_ = 0;
  std::string leaves_, constants_;
};

std::string Codec(const onnx::StructTypeProto& declaration) {
  auto one = [](bool present, const onnx::FunctionProto& function) {
    return present ? function.domain() + ":" + function.name() : std::string("-");
  };
  return "|decoder=" + one(declaration.has_decoder(), declaration.decoder()) +
         "|encoder=" + one(declaration.has_encoder(), declaration.encoder());
}

// ------------------------------------------------------------------------------------ decoders

float LoadFloat(const std::uint8_t* bytes) {
  float value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

std::int64_t LoadInt64(const std::uint8_t* bytes) {  // unaligned reads are fine through memcpy
  std::int64_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

using DecodeRecord = void (*)(const std::uint8_t* record, float* out);

// Int4Block: 32 signed INT4 codes (low nibble first) then a FLOAT scale; code * scale.
void DecodeInt4Block(const std::uint8_t* record, float* out) {
  const float scale = LoadFloat(record + 16);
  for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(UnpackCode(record, i, 4, true)) * scale;
}

// DecodeLinearInt4 with per-value parameters: 128 INT4 codes, FLOAT scale, INT64 zero point at byte 68.
void DecodeLinearWithParameters(const std::uint8_t* record, float* out) {
  const float scale = LoadFloat(record + 64);
  const auto zero_point = static_cast<float>(LoadInt64(record + 68));
  for (int i = 0; i < 128; ++i) out[i] = (static_cast<float>(UnpackCode(record, i, 4, true)) - zero_point) * scale;
}

// DecodeLinearInt4 with the type's constants scale 0.25 and zero point -2 (fixed by the signature).
void DecodeLinearFixed(const std::uint8_t* record, float* out) {
  for (int i = 0; i < 128; ++i) out[i] = (static_cast<float>(UnpackCode(record, i, 4, true)) + 2.0f) * 0.25f;
}

// DecodeScaledCodebookBlocks: scale * codebook[index], 32 two-bit indices then a FLOAT scale; the
// codebook is subtype 1101's constant (fixed by the signature).
void DecodeScaledCodebook(const std::uint8_t* record, float* out) {
  static const float kCodebook[4] = {-1.0f, -0.25f, 0.25f, 1.0f};
  const float scale = LoadFloat(record + 8);
  for (int i = 0; i < 32; ++i) out[i] = scale * kCodebook[UnpackCode(record, i, 2, false)];
}

struct Registration {
  std::uint64_t type_id;
  const char* signature;  // LayoutSignature of the declaration the decoder was written for
  int values_per_record;
  DecodeRecord decode;
};

const Registration kRegistrations[] = {
    {2001, "record=160;codes:22/4@0[32x4];scale:1/32@128;||decoder=-|encoder=-", 32, DecodeInt4Block},
    {1002,
     "record=608;values:22/4@0[128x4];scale:1/32@512;zero_point:7/64@544;||decoder=:DecodeLinearInt4|encoder=-",
     128, DecodeLinearWithParameters},
    {1003,
     "record=512;values:22/4@0[128x4];|scale:1[]=0000803e;zero_point:7[]=feffffffffffffff;"
     "|decoder=:DecodeLinearInt4|encoder=-",
     128, DecodeLinearFixed},
    {1102,
     "record=96;quantized.codes.index:bits/2@0[32x2];scale:1/32@64;|quantized.codebook:1[4,]="
     "000080bf000080be0000803e0000803f;|decoder=:DecodeScaledCodebookBlocks|encoder=-",
     32, DecodeScaledCodebook},
};

// The decoded run must be exactly the declared logical tensor (FLOAT, matching element count).
std::vector<std::int64_t> LogicalShape(const onnx::EncodedValueProto& value, std::uint64_t count,
                                       const std::string& path) {
  if (!value.has_logical_type()) return {static_cast<std::int64_t>(count)};
  const std::string logical_path = path + ".logical_type";
  const onnx::TypeProto& logical = value.logical_type();
  if (!logical.has_tensor_type()) {
    Fail("LOGICAL_SHAPE_MISMATCH", logical_path, "the decoder produces a tensor; logical_type is not a tensor type");
  }
  if (logical.tensor_type().elem_type() != kFloat) {
    Fail("LOGICAL_SHAPE_MISMATCH", logical_path, "the decoder produces FLOAT values");
  }
  if (!logical.tensor_type().has_shape()) return {static_cast<std::int64_t>(count)};
  std::vector<std::int64_t> dims;
  bool concrete = true;
  for (const auto& dim : logical.tensor_type().shape().dim()) {
    concrete = concrete && dim.has_dim_value();
    dims.push_back(dim.dim_value());
  }
  if (!concrete) {
    if (dims.size() == 1) return {static_cast<std::int64_t>(count)};
    Fail("LOGICAL_SHAPE_MISMATCH", logical_path, "a multi-dimensional logical shape must be concrete");
  }
  std::optional<std::uint64_t> declared = 1;
  for (std::int64_t dim : dims) {
    if (declared) declared = CheckedMul(*declared, static_cast<std::uint64_t>(dim));
  }
  if (!declared || *declared != count) {
    Fail("LOGICAL_SHAPE_MISMATCH", logical_path,
         "the decoder produced " + std::to_string(count) + " values for a different logical shape");
  }
  return dims;
}

}  // namespace

std::string LayoutSignature(const Catalogue& catalogue, const onnx::StructTypeProto& root, const std::string& path) {
  Flattener flattener(catalogue);
  BitSize bits = catalogue.StructBits(root, path, 0);
  if (!bits.fixed || !flattener.Struct(root, "", 0, "", path)) return "unbounded";
  const onnx::StructTypeProto& declaration = root.has_type_ref() ? catalogue.Lookup(root.type_ref(), path) : root;
  return flattener.Signature(bits.bits) + Codec(declaration);
}

onnx_light::testee::Value DecodeRegistered(const Catalogue& catalogue, const onnx::EncodedValueProto& value,
                                           const Payload& payload, std::uint64_t record_bytes,
                                           const std::string& path) {
  const std::string layout_path = path + ".struct_type";
  const onnx::StructTypeProto& layout = value.struct_type();
  if (!layout.has_type_ref()) {
    Fail("CONSUMER_MISSING", layout_path, "an inline layout has no decoder; it needs generic field access");
  }
  const Registration* registration = nullptr;
  for (const Registration& candidate : kRegistrations) {
    if (candidate.type_id == layout.type_ref()) registration = &candidate;
  }
  if (registration == nullptr) {
    Unsupported(layout_path, "this runtime binds no decoder for type_id " + std::to_string(layout.type_ref()));
  }
  if (LayoutSignature(catalogue, layout, layout_path) != registration->signature) {
    Fail("DECODER_MISMATCH", layout_path, "the decoder for type_id " + std::to_string(layout.type_ref()) +
                                              " was written for a different declaration");
  }
  const std::uint64_t records = record_bytes ? payload.size / record_bytes : 0;
  const std::uint64_t count = records * static_cast<std::uint64_t>(registration->values_per_record);
  if (count > kMaxDecodedElements) {
    Fail("RESOURCE_LIMIT", path, std::to_string(count) + " decoded values exceed this runtime's limit");
  }
  std::vector<std::int64_t> shape = LogicalShape(value, count, path);
  std::vector<std::uint8_t> out(count * sizeof(float));
  auto* floats = reinterpret_cast<float*>(out.data());
  for (std::uint64_t r = 0; r < records; ++r) {
    registration->decode(payload.data + r * record_bytes, floats + r * registration->values_per_record);
  }
  return onnx_light::testee::Value::Tensor("float32", std::move(shape), std::move(out));
}

}  // namespace example
