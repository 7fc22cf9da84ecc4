#include "convert.h"

#include <cstdint>
#include <limits>
#include <string>

namespace onnx_light::testee::internal {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

// Bytes a fixed-width tensor of this shape (and strides) must hold, or nullopt when the arithmetic
// overflows or a dimension or stride is negative.
std::optional<std::uint64_t> ExpectedBytes(std::size_t item, const std::vector<std::int64_t>& shape,
                                           const std::vector<std::int64_t>& strides) {
  std::uint64_t elements = 1;
  for (std::int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (dim != 0 && elements > kMax / static_cast<std::uint64_t>(dim)) return std::nullopt;
    elements *= static_cast<std::uint64_t>(dim);
  }
  if (!strides.empty()) {
    if (strides.size() != shape.size()) return std::nullopt;
    if (elements == 0) return 0;
    std::uint64_t span = 1;  // index of the last element, plus one
    for (std::size_t axis = 0; axis < shape.size(); ++axis) {
      if (strides[axis] < 0) return std::nullopt;
      auto stride = static_cast<std::uint64_t>(strides[axis]);
      auto reach = static_cast<std::uint64_t>(shape[axis] - 1);
      if (stride != 0 && reach > (kMax - span) / stride) return std::nullopt;
      span += reach * stride;
    }
    elements = span;
  }
  if (elements > kMax / item) return std::nullopt;
  return elements * item;
}

std::uint64_t AddressOf(const void* data, std::size_t size) {
  return size ? static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(data)) : 0;
}

// The identity a value is reported with: the runtime's buffer_id, else its data address; 0 is none.
std::uint64_t IdentityOf(const Value& value) {
  return value.buffer_id ? value.buffer_id : AddressOf(value.data, value.size);
}

// Sets buffer_id and has_buffer_id of a Tensor or Encoded, and records the leaf under its identity.
template <typename Message>
void Report(const Value& value, Message* out, Reports* reports) {
  const std::uint64_t id = IdentityOf(value);
  out->set_buffer_id(id);
  out->set_has_buffer_id(id != 0);
  if (!reports || !value.owner) return;
  reports->owners.push_back(value.owner);
  if (id != 0) {
    Value leaf = value;
    leaf.reported_id.reset();
    reports->leaves.emplace_back(id, std::move(leaf));
  }
}

// A request's leaf that names a buffer this testee reported: the runtime's own buffer when the SDK still
// holds it and the copy reproduces it, else the copy; either way `reported_id` tells the id.
template <typename Message>
Value HandBack(Value copy, const Message& message, const HandedBack* handed_back) {
  if (!message.has_buffer_id()) return copy;
  copy.reported_id = message.buffer_id();
  if (!handed_back || copy.ownerless) return copy;  // a loan is a fresh borrow, never a handed-out buffer
  std::optional<Value> found = (*handed_back)(message.buffer_id(), copy);
  if (!found) return copy;
  found->reported_id = message.buffer_id();
  return *found;
}

}  // namespace

std::string EscapeInvalidUtf8(std::string_view text) {
  if (IsValidUtf8(text)) return std::string(text);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    // Keep the longest valid run starting here (at most one code point of 4 bytes is tried at a time).
    std::size_t take = 0;
    for (std::size_t length = 1; length <= 4 && i + length <= text.size(); ++length) {
      if (IsValidUtf8(text.substr(i, length))) {
        take = length;
        break;
      }
    }
    if (take) {
      out.append(text.substr(i, take));
      i += take;
    } else {
      auto byte = static_cast<unsigned char>(text[i++]);
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

void RequireUtf8(std::string_view text, const char* what) {
  if (!IsValidUtf8(text)) throw std::logic_error(std::string(what) + " is not valid UTF-8: " + EscapeInvalidUtf8(text));
}

Value FromProto(const pb::Value& proto, const std::shared_ptr<const void>& owner, const HandedBack* handed_back) {
  Value value;
  switch (proto.kind_case()) {
    case pb::Value::kTensor:
    case pb::Value::KIND_NOT_SET: {  // an unset value is an empty tensor, as in the Python transport
      const pb::Tensor& tensor = proto.tensor();
      value.kind = Value::Kind::kTensor;
      value.dtype = tensor.dtype();
      value.shape.assign(tensor.shape().begin(), tensor.shape().end());
      value.strides.assign(tensor.strides().begin(), tensor.strides().end());
      value.read_only = tensor.read_only();
      value.ownerless = tensor.ownerless();
      if (value.dtype == "str") {
        value.strings.assign(tensor.strings().begin(), tensor.strings().end());
      } else if (value.dtype == "bytes") {
        value.strings.assign(tensor.byte_strings().begin(), tensor.byte_strings().end());
      } else {
        value.data = reinterpret_cast<const std::uint8_t*>(tensor.data().data());
        value.size = tensor.data().size();
        if (!value.ownerless) value.owner = owner;  // a loan has no owner the runtime could keep
        value.buffer_id = AddressOf(value.data, value.size);
        if (std::size_t item = ItemSize(value.dtype)) {
          auto expected = ExpectedBytes(item, value.shape, value.strides);
          if (!expected || *expected != value.size) {
            throw ProtocolError("tensor of dtype " + value.dtype + " carries " + std::to_string(value.size) +
                                " bytes, which does not match its shape and strides");
          }
        }
      }
      return HandBack(std::move(value), tensor, handed_back);
    }
    case pb::Value::kStruct:
      value.kind = Value::Kind::kStruct;
      for (const pb::StructField& field : proto.struct_().fields()) {
        value.fields.emplace_back(field.name(), FromProto(field.value(), owner, handed_back));
      }
      if (proto.struct_().has_type_id()) value.type_id = proto.struct_().type_id();
      return value;
    case pb::Value::kSequence:
      value.kind = Value::Kind::kSequence;
      for (const pb::Value& item : proto.sequence().items()) {
        value.items.push_back(FromProto(item, owner, handed_back));
      }
      return value;
    case pb::Value::kEncoded:
      value.kind = Value::Kind::kEncoded;
      value.header = proto.encoded().header();
      value.data = reinterpret_cast<const std::uint8_t*>(proto.encoded().payload().data());
      value.size = proto.encoded().payload().size();
      value.owner = owner;
      value.buffer_id = AddressOf(value.data, value.size);
      value.read_only = proto.encoded().read_only();
      return HandBack(std::move(value), proto.encoded(), handed_back);
    case pb::Value::kNone:
      return value;
  }
  throw ProtocolError("unknown value kind");
}

NamedValues FromProto(const google::protobuf::RepeatedPtrField<pb::NamedValue>& named,
                      const std::shared_ptr<const void>& owner, const HandedBack* handed_back) {
  NamedValues values;
  values.reserve(named.size());
  for (const pb::NamedValue& item : named) {
    values.emplace_back(item.name(), FromProto(item.value(), owner, handed_back));
  }
  return values;
}

void ToProto(const Value& value, pb::Value* out, bool with_data, Reports* reports) {
  switch (value.kind) {
    case Value::Kind::kNone:
      out->set_none(true);
      return;
    case Value::Kind::kTensor: {
      pb::Tensor* tensor = out->mutable_tensor();
      RequireUtf8(value.dtype, "a tensor's dtype");
      tensor->set_dtype(value.dtype);
      for (std::int64_t dim : value.shape) tensor->add_shape(dim);
      for (std::int64_t stride : value.strides) tensor->add_strides(stride);
      tensor->set_read_only(value.read_only);
      tensor->set_ownerless(value.ownerless);
      if (value.dtype == "str" || value.dtype == "bytes") {
        if (value.strings.size() != value.element_count()) {
          throw std::logic_error("a " + value.dtype + " tensor holds " + std::to_string(value.strings.size()) +
                                 " elements, its shape " + std::to_string(value.element_count()));
        }
        if (with_data) {
          for (const std::string& item : value.strings) {
            if (value.dtype == "str") {
              RequireUtf8(item, "an element of a \"str\" tensor (use dtype \"bytes\" for byte strings)");
              tensor->add_strings(item);
            } else {
              tensor->add_byte_strings(item);
            }
          }
        }
      } else {
        if (std::size_t item = ItemSize(value.dtype)) {
          auto expected = ExpectedBytes(item, value.shape, value.strides);
          if (!expected || *expected != value.size) {
            throw std::logic_error("a " + value.dtype + " tensor holds " + std::to_string(value.size) +
                                   " bytes, which does not match its shape and strides");
          }
        }
        if (value.size && value.data == nullptr) throw std::logic_error("a tensor has a size but no data");
        if (with_data) tensor->set_data(reinterpret_cast<const char*>(value.data), value.size);
      }
      Report(value, tensor, reports);
      return;
    }
    case Value::Kind::kStruct: {
      pb::Struct* record = out->mutable_struct_();
      for (const auto& [name, field] : value.fields) {
        pb::StructField* added = record->add_fields();
        added->set_name(name);
        ToProto(field, added->mutable_value(), with_data, reports);
      }
      if (value.type_id) {
        record->set_type_id(*value.type_id);
        record->set_has_type_id(true);
      }
      return;
    }
    case Value::Kind::kSequence: {
      pb::Sequence* sequence = out->mutable_sequence();
      for (const Value& item : value.items) ToProto(item, sequence->add_items(), with_data, reports);
      return;
    }
    case Value::Kind::kEncoded: {
      pb::Encoded* encoded = out->mutable_encoded();
      encoded->set_header(value.header);
      if (value.size && value.data == nullptr) throw std::logic_error("an encoded value has a size but no data");
      if (with_data) encoded->set_payload(reinterpret_cast<const char*>(value.data), value.size);
      encoded->set_read_only(value.read_only);
      Report(value, encoded, reports);
      return;
    }
  }
  throw std::logic_error("unknown value kind");
}

void ToProto(const NamedValues& values, google::protobuf::RepeatedPtrField<pb::NamedValue>* out, bool with_data,
             Reports* reports) {
  for (const auto& [name, value] : values) {
    pb::NamedValue* added = out->Add();
    added->set_name(name);
    ToProto(value, added->mutable_value(), with_data, reports);
  }
}

}  // namespace onnx_light::testee::internal
