// Graph rewrites a state may be opened over (spec: "GraphBuilder, shape inference and serialization"):
// a rename updates every use of the name, bindings included. Other rewrite kinds are NotSupported.
#pragma once

#include <string>
#include <string_view>

namespace example {

// The model with the rewrite `rewrite_json` ({"kind": "rename", "old": ..., "new": ...}) applied.
std::string RewriteModel(std::string_view model, const std::string& rewrite_json);

}  // namespace example
