// Struct declarations (spec: "Catalogue and identity contract", "Struct types and byte-encodable
// layouts", "Byte-encoding rules and validation"): the catalogue's identity rules, well-formed
// declarations and types, references without cycles, and record sizes by the spec's size table with
// checked uint64 arithmetic. Sizes are computed only for the layouts values actually use: a struct that
// is not fixed-size stays a valid type.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "onnx-light.pb.h"

namespace example {

// Where a StructTypeProto appears: a catalogue declaration, inside a TypeProto, or as a payload layout.
enum class Role { kDeclaration, kType, kLayout };

// The size of one element in bits, or why it has none.
struct BitSize {
  bool fixed = true;
  std::uint64_t bits = 0;
  std::string path, reason;  // where and why the size is not fixed
};

class Catalogue {
 public:
  // Nesting this runtime follows, counted through resolved references (NESTING_TOO_DEEP beyond).
  static constexpr int kMaxDepth = 64;

  // Identity (nonzero, unique IDs of concrete declarations), then every declaration's structure, then
  // the absence of reference cycles. Throws the first violation.
  explicit Catalogue(const google::protobuf::RepeatedPtrField<onnx::StructTypeProto>& declarations);

  // The declaration a type_ref names (TYPE_REF_UNRESOLVED when none).
  const onnx::StructTypeProto& Lookup(std::uint64_t type_id, const std::string& path) const;

  void CheckStruct(const onnx::StructTypeProto& st, const std::string& path, Role role, int depth) const;
  void CheckType(const onnx::TypeProto& type, const std::string& path, int depth) const;

  BitSize StructBits(const onnx::StructTypeProto& st, const std::string& path, int depth) const;
  BitSize TypeBits(const onnx::TypeProto& type, const std::string& path, int depth) const;

 private:
  void CheckAcyclic() const;

  std::map<std::uint64_t, std::pair<const onnx::StructTypeProto*, std::string>> declarations_;
  std::vector<std::uint64_t> order_;       // declaration IDs in catalogue order
  mutable std::map<std::uint64_t, BitSize> sizes_;  // per referenced ID: sizes do not depend on the path
};

// True when a TypeProto is, or nests through sequence/map/optional, a struct type.
bool ContainsStruct(const onnx::TypeProto& type);

}  // namespace example
