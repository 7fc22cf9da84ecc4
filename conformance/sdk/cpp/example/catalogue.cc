#include "catalogue.h"

#include <set>
#include <vector>

#include "common.h"
#include "tensor_data.h"

namespace example {
namespace {

void CheckDepth(int depth, const std::string& path) {
  if (depth > Catalogue::kMaxDepth) {
    Fail("NESTING_TOO_DEEP", path, "types nest deeper than " + std::to_string(Catalogue::kMaxDepth));
  }
}

// Field and component names: non-empty and unique within their structure or bit packing.
template <typename Items>
void CheckNames(const Items& items, const std::string& path) {
  std::set<std::string> seen;
  for (int i = 0; i < items.size(); ++i) {
    const std::string item_path = path + "[" + std::to_string(i) + "].name";
    if (items.Get(i).name().empty()) Fail("NAME_EMPTY", item_path, "names must be non-empty");
    if (!seen.insert(items.Get(i).name()).second) Fail("NAME_DUPLICATE", item_path, "the name repeats");
  }
}

bool IsMapKey(int type) {
  return type == 2 || type == 3 || type == 4 || type == 5 || type == 6 || type == 7 || type == 8 || type == 12 ||
         type == 13;
}

BitSize NotFixed(const std::string& path, const std::string& reason) { return BitSize{false, 0, path, reason}; }

BitSize Fixed(std::uint64_t bits) { return BitSize{true, bits, "", ""}; }

std::uint64_t Mul(std::uint64_t a, std::uint64_t b, const std::string& path) {
  auto product = CheckedMul(a, b);
  if (!product) Fail("SIZE_OVERFLOW", path, std::to_string(a) + " * " + std::to_string(b) + " overflows uint64");
  return *product;
}

std::uint64_t Add(std::uint64_t a, std::uint64_t b, const std::string& path) {
  auto sum = CheckedAdd(a, b);
  if (!sum) Fail("SIZE_OVERFLOW", path, std::to_string(a) + " + " + std::to_string(b) + " overflows uint64");
  return *sum;
}

void RefsInStruct(const onnx::StructTypeProto& st, std::set<std::uint64_t>* refs);

void RefsInType(const onnx::TypeProto& type, std::set<std::uint64_t>* refs) {
  if (type.has_struct_type()) RefsInStruct(type.struct_type(), refs);
  if (type.has_sequence_type() && type.sequence_type().has_elem_type()) RefsInType(type.sequence_type().elem_type(), refs);
  if (type.has_map_type() && type.map_type().has_value_type()) RefsInType(type.map_type().value_type(), refs);
  if (type.has_optional_type() && type.optional_type().has_elem_type()) RefsInType(type.optional_type().elem_type(), refs);
}

// The IDs a declaration references directly (references are not followed).
void RefsInStruct(const onnx::StructTypeProto& st, std::set<std::uint64_t>* refs) {
  switch (st.kind_case()) {
    case onnx::StructTypeProto::kTypeRef:
      refs->insert(st.type_ref());
      break;
    case onnx::StructTypeProto::kArray:
      if (st.array().has_element_type()) RefsInType(st.array().element_type(), refs);
      break;
    case onnx::StructTypeProto::kStructure:
      for (const auto& field : st.structure().field()) {
        if (field.has_type()) RefsInType(field.type(), refs);
      }
      break;
    default:
      break;
  }
}

}  // namespace

bool ContainsStruct(const onnx::TypeProto& type) {
  switch (type.value_case()) {
    case onnx::TypeProto::kStructType: return true;
    case onnx::TypeProto::kSequenceType: return ContainsStruct(type.sequence_type().elem_type());
    case onnx::TypeProto::kMapType: return ContainsStruct(type.map_type().value_type());
    case onnx::TypeProto::kOptionalType: return ContainsStruct(type.optional_type().elem_type());
    default: return false;
  }
}

Catalogue::Catalogue(const google::protobuf::RepeatedPtrField<onnx::StructTypeProto>& declarations) {
  for (int i = 0; i < declarations.size(); ++i) {
    const onnx::StructTypeProto& declaration = declarations.Get(i);
    const std::string path = "model.struct_types[" + std::to_string(i) + "]";
    if (!declaration.has_type_id()) Fail("TYPE_ID_MISSING", path, "catalogue declarations need a type_id");
    if (declaration.type_id() == 0) Fail("TYPE_ID_ZERO", path + ".type_id", "type_id must be nonzero");
    if (declaration.kind_case() == onnx::StructTypeProto::KIND_NOT_SET) {
      Fail("KINDLESS_MISPLACED", path, "a kind-less StructTypeProto is never a catalogue declaration");
    }
    if (declaration.kind_case() == onnx::StructTypeProto::kTypeRef) {
      Fail("DECLARATION_NOT_CONCRETE", path, "a declaration selects array, structure or bit_packing");
    }
    if (!declarations_.emplace(declaration.type_id(), std::make_pair(&declaration, path)).second) {
      Fail("TYPE_ID_DUPLICATE", path + ".type_id", "type_id " + std::to_string(declaration.type_id()) +
                                                       " is already declared");
    }
    order_.push_back(declaration.type_id());
  }
  for (std::uint64_t id : order_) {
    const auto& [declaration, path] = declarations_.at(id);
    CheckStruct(*declaration, path, Role::kDeclaration, 0);
  }
  CheckAcyclic();
}

const onnx::StructTypeProto& Catalogue::Lookup(std::uint64_t type_id, const std::string& path) const {
  auto found = declarations_.find(type_id);
  if (found == declarations_.end()) {
    Fail("TYPE_REF_UNRESOLVED", path, "type_ref " + std::to_string(type_id) + " names no declaration");
  }
  return *found->second.first;
}

void Catalogue::CheckStruct(const onnx::StructTypeProto& st, const std::string& path, Role role, int depth) const {
  CheckDepth(depth, path);
  if (st.kind_case() == onnx::StructTypeProto::kTypeRef) {
    // A reference carries only the ID.
    if (st.has_decoder() || st.has_encoder() || st.has_name() || st.has_doc_string() || st.has_type_id() ||
        st.metadata_props_size() > 0) {
      Fail("TYPE_REF_EXTRA_FIELDS", path, "a type_ref carries only the referenced ID");
    }
    Lookup(st.type_ref(), path + ".type_ref");
    return;
  }
  if (role != Role::kDeclaration && st.has_type_id()) {
    Fail("INLINE_TYPE_ID", path + ".type_id", "an inline declaration has no type_id and cannot be referenced");
  }
  switch (st.kind_case()) {
    case onnx::StructTypeProto::KIND_NOT_SET:
      if (role != Role::kType) {
        Fail("KINDLESS_MISPLACED", path, "a kind-less StructTypeProto is only a category inside TypeProto");
      }
      return;
    case onnx::StructTypeProto::kArray: {
      const auto& array = st.array();
      if (!array.has_element_type()) Fail("ARRAY_ELEMENT_MISSING", path + ".array", "array has no element_type");
      if (array.dimension() == 0) Fail("DIMENSION_INVALID", path + ".array.dimension", "array length must be > 0");
      CheckType(array.element_type(), path + ".array.element_type", depth + 1);
      return;
    }
    case onnx::StructTypeProto::kBitPacking: {
      const auto& packing = st.bit_packing();
      if (packing.component_size() == 0) Fail("BIT_PACKING_EMPTY", path + ".bit_packing", "no components");
      if (packing.dimension() == 0) {
        Fail("DIMENSION_INVALID", path + ".bit_packing.dimension", "bit-packing count must be > 0");
      }
      CheckNames(packing.component(), path + ".bit_packing.component");
      for (int i = 0; i < packing.component_size(); ++i) {
        std::uint32_t width = packing.component(i).bit_width();
        if (width < 1 || width > 64) {
          Fail("BIT_WIDTH_INVALID", path + ".bit_packing.component[" + std::to_string(i) + "].bit_width",
               "bit width " + std::to_string(width) + " is outside 1..64");
        }
      }
      return;
    }
    case onnx::StructTypeProto::kStructure: {
      const auto& fields = st.structure().field();
      if (fields.empty()) Fail("STRUCTURE_EMPTY", path + ".structure", "structure has no fields");
      CheckNames(fields, path + ".structure.field");
      for (int i = 0; i < fields.size(); ++i) {
        const auto& field = fields.Get(i);
        const std::string field_path = path + ".structure.field[" + std::to_string(i) + "]";
        if (field.has_type()) {
          CheckType(field.type(), field_path + ".type", depth + 1);
        } else if (field.has_constant()) {
          for (std::int64_t dim : field.constant().dims()) {
            if (dim < 0) Fail("CONSTANT_DIMS_INVALID", field_path + ".constant.dims", "dimension is not concrete");
          }
          CheckTensorData(field.constant(), field_path + ".constant");
        } else {
          Fail("FIELD_CONTENT_MISSING", field_path, "a field needs a type or a constant");
        }
      }
      return;
    }
    case onnx::StructTypeProto::kTypeRef:
      return;
  }
}

void Catalogue::CheckType(const onnx::TypeProto& type, const std::string& path, int depth) const {
  CheckDepth(depth, path);
  switch (type.value_case()) {
    case onnx::TypeProto::kTensorType:
    case onnx::TypeProto::kSparseTensorType: {
      const bool dense = type.value_case() == onnx::TypeProto::kTensorType;
      const int elem = dense ? type.tensor_type().elem_type() : type.sparse_tensor_type().elem_type();
      const auto& shape = dense ? type.tensor_type().shape() : type.sparse_tensor_type().shape();
      if (BitWidth(elem) == 0 && elem != kString) {
        Fail("TYPE_INVALID", path, "element type " + std::to_string(elem) + " is not a defined ONNX type");
      }
      for (const auto& dim : shape.dim()) {
        if (dim.has_dim_value() && dim.dim_value() < 0) Fail("TYPE_INVALID", path, "a dimension is negative");
      }
      return;
    }
    case onnx::TypeProto::kSequenceType:
      if (!type.sequence_type().has_elem_type()) Fail("TYPE_INVALID", path, "sequence has no elem_type");
      CheckType(type.sequence_type().elem_type(), path + ".sequence_type.elem_type", depth + 1);
      return;
    case onnx::TypeProto::kMapType:
      if (!IsMapKey(type.map_type().key_type())) Fail("TYPE_INVALID", path, "map keys are integers or strings");
      if (!type.map_type().has_value_type()) Fail("TYPE_INVALID", path, "map has no value_type");
      CheckType(type.map_type().value_type(), path + ".map_type.value_type", depth + 1);
      return;
    case onnx::TypeProto::kOptionalType:
      if (!type.optional_type().has_elem_type()) Fail("TYPE_INVALID", path, "optional has no elem_type");
      CheckType(type.optional_type().elem_type(), path + ".optional_type.elem_type", depth + 1);
      return;
    case onnx::TypeProto::kStructType:
      CheckStruct(type.struct_type(), path + ".struct_type", Role::kType, depth + 1);
      return;
    case onnx::TypeProto::VALUE_NOT_SET:
      Fail("TYPE_INVALID", path, "TypeProto selects no value");
    default:  // opaque types carry no rule of their own
      return;
  }
}

void Catalogue::CheckAcyclic() const {
  std::map<std::uint64_t, std::vector<std::uint64_t>> edges;
  for (std::uint64_t id : order_) {
    std::set<std::uint64_t> refs;
    RefsInStruct(*declarations_.at(id).first, &refs);
    edges[id].assign(refs.begin(), refs.end());
  }
  std::map<std::uint64_t, int> state;  // 1: on the current path, 2: finished
  for (std::uint64_t root : order_) {
    if (state[root]) continue;
    std::vector<std::pair<std::uint64_t, std::size_t>> stack{{root, 0}};
    state[root] = 1;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next == edges[node].size()) {
        state[node] = 2;
        stack.pop_back();
        continue;
      }
      std::uint64_t child = edges[node][next++];
      if (!edges.count(child)) continue;  // unresolved references were reported by CheckStruct
      if (state[child] == 1) Fail("TYPE_REF_CYCLE", declarations_.at(child).second, "type references form a cycle");
      if (!state[child]) {
        state[child] = 1;
        stack.emplace_back(child, 0);
      }
    }
  }
}

BitSize Catalogue::StructBits(const onnx::StructTypeProto& st, const std::string& path, int depth) const {
  CheckDepth(depth, path);
  switch (st.kind_case()) {
    case onnx::StructTypeProto::kTypeRef: {
      auto known = sizes_.find(st.type_ref());
      if (known != sizes_.end()) return known->second;
      const onnx::StructTypeProto& declaration = Lookup(st.type_ref(), path + ".type_ref");
      BitSize size = StructBits(declaration, declarations_.at(st.type_ref()).second, depth + 1);
      sizes_[st.type_ref()] = size;
      return size;
    }
    case onnx::StructTypeProto::KIND_NOT_SET:
      return NotFixed(path, "a kind-less struct has no fixed layout");
    case onnx::StructTypeProto::kArray: {
      BitSize element = TypeBits(st.array().element_type(), path + ".array.element_type", depth + 1);
      if (!element.fixed) return element;
      return Fixed(Mul(st.array().dimension(), element.bits, path + ".array"));
    }
    case onnx::StructTypeProto::kBitPacking: {
      std::uint64_t total = 0;
      for (const auto& component : st.bit_packing().component()) {
        total = Add(total, component.bit_width(), path + ".bit_packing");
      }
      return Fixed(Mul(st.bit_packing().dimension(), total, path + ".bit_packing"));
    }
    case onnx::StructTypeProto::kStructure: {
      std::uint64_t total = 0;
      const auto& fields = st.structure().field();
      for (int i = 0; i < fields.size(); ++i) {
        if (fields.Get(i).has_constant()) continue;  // constants contribute no payload bits
        const std::string field_path = path + ".structure.field[" + std::to_string(i) + "]";
        BitSize field = TypeBits(fields.Get(i).type(), field_path + ".type", depth + 1);
        if (!field.fixed) return field;
        total = Add(total, field.bits, field_path);
      }
      return Fixed(total);
    }
  }
  return NotFixed(path, "unknown struct kind");
}

BitSize Catalogue::TypeBits(const onnx::TypeProto& type, const std::string& path, int depth) const {
  CheckDepth(depth, path);
  if (type.has_tensor_type()) {
    const auto& tensor = type.tensor_type();
    const int width = BitWidth(tensor.elem_type());
    if (width == 0) {
      Fail("UNSUPPORTED_LEAF", path + ".tensor_type.elem_type",
           "element type " + std::to_string(tensor.elem_type()) + " is not a fixed-width scalar");
    }
    if (!tensor.has_shape()) return NotFixed(path, "the tensor has no shape");
    std::uint64_t bits = static_cast<std::uint64_t>(width);
    for (const auto& dim : tensor.shape().dim()) {
      if (!dim.has_dim_value()) return NotFixed(path, "a dimension is not concrete");
      bits = Mul(bits, static_cast<std::uint64_t>(dim.dim_value()), path + ".tensor_type.shape");
    }
    return Fixed(bits);
  }
  if (type.has_struct_type()) return StructBits(type.struct_type(), path + ".struct_type", depth + 1);
  return NotFixed(path, "only tensors and structs have a fixed inline size");
}

}  // namespace example
