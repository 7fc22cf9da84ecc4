// Graph-declared persistence (spec: "Graph-level persistence declaration", "Minimal rules"): the root
// graph's persistent_bindings resolved once against its exact whole inputs and outputs, and the checks
// every value crossing the state boundary passes (declared type, shape and representation; no string
// tensors retained; no ownerless borrow retained or returned).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "catalogue.h"
#include "onnx-light.pb.h"
#include "onnx_light_testee/sdk.h"

namespace example {

struct Bindings {
  std::vector<std::pair<std::string, std::string>> pairs;  // (input, output) in declaration order
  std::map<std::string, const onnx::TypeProto*> inputs;     // every root input's declared type (nullptr: none)
  std::map<std::string, const onnx::TypeProto*> outputs;    // every root output's declared type
  bool Bound(const std::string& input) const;
};

// Rejects bindings in subgraphs or functions (BINDING_IN_SUBGRAPH), names that are no exact whole root
// input/output (BINDING_NAME_UNKNOWN), duplicate selections, incompatible types (BINDING_INCOMPATIBLE)
// and persistent string tensors (BINDING_STRING).
Bindings ResolveBindings(const onnx::ModelProto& model, const Catalogue& catalogue);

// Why `value` does not fit `type` ("" when it does). `retained` adds the persistence rules: no string
// tensors anywhere inside.
std::string Mismatch(const onnx_light::testee::Value& value, const onnx::TypeProto* type, const Catalogue& catalogue,
                     bool retained);

// True when a string tensor sits anywhere inside `value`: a string tensor, or an encoded value whose
// logical type or layout holds one (strings are never persistent).
bool HoldsString(const onnx_light::testee::Value& value, const Catalogue& catalogue);

// True when an ownerless (call-only) buffer sits anywhere inside `value`.
bool HoldsOwnerless(const onnx_light::testee::Value& value);

}  // namespace example
