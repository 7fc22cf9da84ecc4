// A small graph executor for the operators the state and bindings profiles' models use (listed in
// conformance/sdk/cpp/README.md, "Operators of the state profiles"). Values flow by reference: a node
// that hands a value on (Identity, GetField, If, a function output) passes the same buffer and owner, so
// a retained output is the buffer the kernel produced and a forwarded input is the buffer the caller fed.
// Kernels never write into their inputs.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "catalogue.h"
#include "onnx-light.pb.h"
#include "onnx_light_testee/sdk.h"

namespace example {

using Scope = std::map<std::string, onnx_light::testee::Value>;

// What one model's execution needs, fixed when the state opens.
struct Program {
  std::shared_ptr<const onnx::ModelProto> model;
  std::unique_ptr<Catalogue> catalogue;
  Scope constants;  // dense and encoded initializers of the root graph (payloads owned or mapped)
  std::map<std::pair<std::string, std::string>, const onnx::FunctionProto*> functions;
};

// Dense and encoded initializers as values; external payloads are mapped once, here.
Scope ProgramConstants(const std::shared_ptr<const onnx::ModelProto>& model, const std::string& base_dir);

// Runs the root graph over `inputs` (feeds and retained values, over the constants) and returns every
// graph output by name. `hold` is the held run to park at the Hold node, or nullptr. Kernel failures are
// Rejected with the kernel's code; unknown operators are NotSupported.
Scope Execute(const Program& program, const Scope& inputs, onnx_light::testee::HeldRun* hold);

}  // namespace example
