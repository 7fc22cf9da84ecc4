#include "bindings.h"

#include <set>

#include "common.h"
#include "tensors.h"

namespace example {

using onnx_light::testee::Value;

namespace {

constexpr int kMaxDepth = 64;

bool SubgraphBindings(const onnx::GraphProto& graph);

bool NodeBindings(const onnx::NodeProto& node) {
  for (const onnx::AttributeProto& attribute : node.attribute()) {
    if (attribute.has_g() && SubgraphBindings(attribute.g())) return true;
    for (const onnx::GraphProto& graph : attribute.graphs()) {
      if (SubgraphBindings(graph)) return true;
    }
  }
  return false;
}

// A control-flow body that declares bindings itself or nests one that does.
bool SubgraphBindings(const onnx::GraphProto& graph) {
  if (graph.persistent_bindings_size() > 0) return true;
  for (const onnx::NodeProto& node : graph.node()) {
    if (NodeBindings(node)) return true;
  }
  return false;
}

const onnx::StructTypeProto* Resolve(const onnx::StructTypeProto& st, const Catalogue& catalogue, const std::string& path) {
  if (st.kind_case() == onnx::StructTypeProto::kTypeRef) return &catalogue.Lookup(st.type_ref(), path);
  return &st;
}

bool StringInType(const onnx::TypeProto& type, const Catalogue& catalogue, int depth);

bool StringInStruct(const onnx::StructTypeProto& st, const Catalogue& catalogue, int depth) {
  if (depth > kMaxDepth) Fail("NESTING_TOO_DEEP", "type", "types nest too deeply");
  const onnx::StructTypeProto& resolved = *Resolve(st, catalogue, "type");
  switch (resolved.kind_case()) {
    case onnx::StructTypeProto::kStructure:
      for (const auto& field : resolved.structure().field()) {
        if (field.has_constant() && field.constant().data_type() == kString) return true;
        if (field.has_type() && StringInType(field.type(), catalogue, depth + 1)) return true;
      }
      return false;
    case onnx::StructTypeProto::kArray:
      return resolved.array().has_element_type() && StringInType(resolved.array().element_type(), catalogue, depth + 1);
    default:
      return false;
  }
}

bool StringInType(const onnx::TypeProto& type, const Catalogue& catalogue, int depth) {
  if (depth > kMaxDepth) Fail("NESTING_TOO_DEEP", "type", "types nest too deeply");
  switch (type.value_case()) {
    case onnx::TypeProto::kTensorType: return type.tensor_type().elem_type() == kString;
    case onnx::TypeProto::kSparseTensorType: return type.sparse_tensor_type().elem_type() == kString;
    case onnx::TypeProto::kSequenceType:
      return type.sequence_type().has_elem_type() && StringInType(type.sequence_type().elem_type(), catalogue, depth + 1);
    case onnx::TypeProto::kOptionalType:
      return type.optional_type().has_elem_type() && StringInType(type.optional_type().elem_type(), catalogue, depth + 1);
    case onnx::TypeProto::kMapType:
      return type.map_type().key_type() == kString ||
             (type.map_type().has_value_type() && StringInType(type.map_type().value_type(), catalogue, depth + 1));
    case onnx::TypeProto::kStructType: return StringInStruct(type.struct_type(), catalogue, depth + 1);
    default: return false;
  }
}

bool SameStruct(const onnx::StructTypeProto& a, const onnx::StructTypeProto& b) {
  if (a.kind_case() == onnx::StructTypeProto::kTypeRef || b.kind_case() == onnx::StructTypeProto::kTypeRef) {
    return a.kind_case() == b.kind_case() && a.type_ref() == b.type_ref();
  }
  return a.SerializeAsString() == b.SerializeAsString();
}

// Compatible declarations: the same kind, element type, rank and representation; concrete dims agree.
bool Compatible(const onnx::TypeProto& a, const onnx::TypeProto& b, int depth) {
  if (depth > kMaxDepth || a.value_case() != b.value_case()) return false;
  switch (a.value_case()) {
    case onnx::TypeProto::kTensorType: {
      const auto& x = a.tensor_type();
      const auto& y = b.tensor_type();
      if (x.elem_type() != y.elem_type()) return false;
      if (!x.has_shape() || !y.has_shape()) return true;
      if (x.shape().dim_size() != y.shape().dim_size()) return false;
      for (int i = 0; i < x.shape().dim_size(); ++i) {
        const auto& p = x.shape().dim(i);
        const auto& q = y.shape().dim(i);
        if (p.has_dim_value() && q.has_dim_value() && p.dim_value() != q.dim_value()) return false;
      }
      return true;
    }
    case onnx::TypeProto::kSequenceType:
      return Compatible(a.sequence_type().elem_type(), b.sequence_type().elem_type(), depth + 1);
    case onnx::TypeProto::kOptionalType:
      return Compatible(a.optional_type().elem_type(), b.optional_type().elem_type(), depth + 1);
    case onnx::TypeProto::kMapType:
      return a.map_type().key_type() == b.map_type().key_type() &&
             Compatible(a.map_type().value_type(), b.map_type().value_type(), depth + 1);
    case onnx::TypeProto::kStructType: return SameStruct(a.struct_type(), b.struct_type());
    default: return a.SerializeAsString() == b.SerializeAsString();
  }
}

std::string ShapeText(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string StructMismatch(const Value& value, const onnx::StructTypeProto& declared, const Catalogue& catalogue,
                           bool retained, int depth);

std::string TypeMismatch(const Value& value, const onnx::TypeProto& type, const Catalogue& catalogue, bool retained,
                         int depth) {
  if (depth > kMaxDepth) return "values nest too deeply";
  switch (type.value_case()) {
    case onnx::TypeProto::kTensorType: {
      const auto& tensor = type.tensor_type();
      if (value.kind != Value::Kind::kTensor) return "a tensor is declared";
      const bool is_string = value.dtype == "str" || value.dtype == "bytes";
      if (retained && is_string) return "string tensors cannot be retained";
      if (tensor.elem_type() == kString ? !is_string : value.dtype != DtypeName(tensor.elem_type())) {
        return "element type " + value.dtype + " is not the declared " + std::to_string(tensor.elem_type());
      }
      if (!tensor.has_shape()) return "";
      if (tensor.shape().dim_size() != static_cast<int>(value.shape.size())) {
        return "shape " + ShapeText(value.shape) + " has another rank than declared";
      }
      for (int i = 0; i < tensor.shape().dim_size(); ++i) {
        const auto& dim = tensor.shape().dim(i);
        if (dim.has_dim_value() && dim.dim_value() != value.shape[i]) {
          return "shape " + ShapeText(value.shape) + " differs from the declared dims";
        }
      }
      return "";
    }
    case onnx::TypeProto::kSequenceType: {
      if (value.kind != Value::Kind::kSequence) return "a sequence is declared";
      for (const Value& item : value.items) {
        if (!type.sequence_type().has_elem_type()) break;
        std::string why = TypeMismatch(item, type.sequence_type().elem_type(), catalogue, retained, depth + 1);
        if (!why.empty()) return "sequence item: " + why;
      }
      return "";
    }
    case onnx::TypeProto::kOptionalType:
      if (value.kind == Value::Kind::kNone || !type.optional_type().has_elem_type()) return "";
      return TypeMismatch(value, type.optional_type().elem_type(), catalogue, retained, depth + 1);
    case onnx::TypeProto::kStructType:
      return StructMismatch(value, type.struct_type(), catalogue, retained, depth + 1);
    case onnx::TypeProto::VALUE_NOT_SET:
      return "";
    default:
      return "a value of a type this runtime does not hold";
  }
}

std::string StructMismatch(const Value& value, const onnx::StructTypeProto& declared, const Catalogue& catalogue,
                           bool retained, int depth) {
  if (declared.kind_case() == onnx::StructTypeProto::KIND_NOT_SET) return "";  // an unconstrained category
  if (value.kind == Value::Kind::kEncoded) {
    onnx::EncodedValueProto header;
    if (!header.ParseFromString(value.header)) return "an encoded value whose header does not parse";
    if (!header.has_struct_type() || !SameStruct(header.struct_type(), declared)) {
      return "an encoded value of another layout than the declared struct type";
    }
    return "";
  }
  if (value.kind != Value::Kind::kStruct) return "a struct value is declared";
  if (declared.kind_case() == onnx::StructTypeProto::kTypeRef && value.type_id && *value.type_id != declared.type_ref()) {
    return "struct type_id " + std::to_string(*value.type_id) + " is not the declared " + std::to_string(declared.type_ref());
  }
  const onnx::StructTypeProto& resolved = *Resolve(declared, catalogue, "type");
  if (resolved.kind_case() != onnx::StructTypeProto::kStructure) return "";
  std::map<std::string, const Value*> fields;
  for (const auto& [name, field] : value.fields) {
    if (!fields.emplace(name, &field).second) return "field " + name + " repeats";
  }
  for (const auto& field : resolved.structure().field()) {
    auto found = fields.find(field.name());
    if (field.has_constant()) {
      if (retained && field.constant().data_type() == kString) return "a string constant cannot be retained";
      if (found != fields.end()) fields.erase(found);
      continue;
    }
    if (found == fields.end()) return "field " + field.name() + " is missing";
    std::string why = TypeMismatch(*found->second, field.type(), catalogue, retained, depth + 1);
    if (!why.empty()) return "field " + field.name() + ": " + why;
    fields.erase(found);
  }
  if (!fields.empty()) return "field " + fields.begin()->first + " is not declared";
  return "";
}

}  // namespace

bool Bindings::Bound(const std::string& input) const {
  for (const auto& pair : pairs) {
    if (pair.first == input) return true;
  }
  return false;
}

Bindings ResolveBindings(const onnx::ModelProto& model, const Catalogue& catalogue) {
  const onnx::GraphProto& graph = model.graph();
  for (const onnx::NodeProto& node : graph.node()) {
    if (NodeBindings(node)) Fail("BINDING_IN_SUBGRAPH", "model.graph", "bindings in a control-flow subgraph");
  }
  for (const onnx::FunctionProto& function : model.functions()) {
    for (const onnx::NodeProto& node : function.node()) {
      if (NodeBindings(node)) Fail("BINDING_IN_SUBGRAPH", "model.functions", "bindings inside a function body");
    }
  }
  for (const onnx::StructTypeProto& declaration : model.struct_types()) {
    for (const onnx::FunctionProto* codec : {&declaration.decoder(), &declaration.encoder()}) {
      for (const onnx::NodeProto& node : codec->node()) {
        if (NodeBindings(node)) Fail("BINDING_IN_SUBGRAPH", "model.struct_types", "bindings inside a codec body");
      }
    }
  }
  Bindings bindings;
  for (const onnx::ValueInfoProto& input : graph.input()) {
    bindings.inputs[input.name()] = input.has_type() ? &input.type() : nullptr;
  }
  for (const onnx::ValueInfoProto& output : graph.output()) {
    bindings.outputs[output.name()] = output.has_type() ? &output.type() : nullptr;
  }
  std::set<std::string> inputs, outputs;
  for (int i = 0; i < graph.persistent_bindings_size(); ++i) {
    const onnx::PersistentBindingProto& binding = graph.persistent_bindings(i);
    const std::string path = "model.graph.persistent_bindings[" + std::to_string(i) + "]";
    // A field this schema does not know (an earlier draft's field path) would change what is selected.
    if (!binding.unknown_fields().empty()) Fail("BINDING_NAME_UNKNOWN", path, "the binding carries an unknown field");
    auto input = bindings.inputs.find(binding.input_name());
    auto output = bindings.outputs.find(binding.output_name());
    if (input == bindings.inputs.end()) Fail("BINDING_NAME_UNKNOWN", path, "no whole graph input of that name");
    if (output == bindings.outputs.end()) Fail("BINDING_NAME_UNKNOWN", path, "no whole graph output of that name");
    if (!inputs.insert(binding.input_name()).second) Fail("BINDING_INPUT_DUPLICATE", path, "the input is already bound");
    if (!outputs.insert(binding.output_name()).second) Fail("BINDING_OUTPUT_DUPLICATE", path, "the output is already bound");
    if (!input->second || !output->second || !Compatible(*input->second, *output->second, 0)) {
      Fail("BINDING_INCOMPATIBLE", path, "the bound input and output have incompatible types or shapes");
    }
    if (StringInType(*input->second, catalogue, 0) || StringInType(*output->second, catalogue, 0)) {
      Fail("BINDING_STRING", path, "a persistent value contains a string tensor");
    }
    bindings.pairs.emplace_back(binding.input_name(), binding.output_name());
  }
  return bindings;
}

std::string Mismatch(const Value& value, const onnx::TypeProto* type, const Catalogue& catalogue, bool retained) {
  if (!type) return "";
  return TypeMismatch(value, *type, catalogue, retained, 0);
}

bool HoldsString(const Value& value, const Catalogue& catalogue) {
  if (value.kind == Value::Kind::kTensor) return value.dtype == "str" || value.dtype == "bytes";
  if (value.kind == Value::Kind::kEncoded) {
    onnx::EncodedValueProto header;
    if (!header.ParseFromString(value.header)) return false;
    if (header.has_logical_type() && StringInType(header.logical_type(), catalogue, 0)) return true;
    return header.has_struct_type() && StringInStruct(header.struct_type(), catalogue, 0);
  }
  for (const auto& field : value.fields) {
    if (HoldsString(field.second, catalogue)) return true;
  }
  for (const Value& item : value.items) {
    if (HoldsString(item, catalogue)) return true;
  }
  return false;
}

bool HoldsOwnerless(const Value& value) {
  if (value.ownerless) return true;
  for (const auto& field : value.fields) {
    if (HoldsOwnerless(field.second)) return true;
  }
  for (const Value& item : value.items) {
    if (HoldsOwnerless(item)) return true;
  }
  return false;
}

}  // namespace example
