// The example runtime: a vendor's view of the contract for the affine, external-data, state, bindings and
// zero-copy profiles, served over the testee protocol by the SDK.
#include "runtime.h"

#include "affine.h"
#include "common.h"
#include "model.h"
#include "registered.h"
#include "rewrite.h"

namespace example {

using onnx_light::testee::Value;

onnx_light::testee::Hello ExampleRuntime::GetHello() {
  return {"onnx-light-example-testee", ONNX_LIGHT_EXAMPLE_VERSION, {"affine", "external-data", "state", "bindings", "zero-copy"}, {}};
}

void ExampleRuntime::Verify(std::string_view model, const std::string& base_dir) { VerifyModel(model, base_dir); }

Value ExampleRuntime::Decode(std::string_view model, const std::string& value_name, const std::string& base_dir) {
  VerifiedModel verified = VerifyModel(model, base_dir);
  for (const EncodedInfo& info : verified.values) {
    if (info.value->name() != value_name) continue;
    Payload payload = OpenPayload(*info.value, info.extent, base_dir, info.path, verified.model);
    if (info.affine) return DecodeAffine(*info.value, *info.affine, payload, info.path);
    return DecodeRegistered(*verified.catalogue, *info.value, payload, info.record_bytes, info.path);
  }
  Fail("VALUE_NOT_FOUND", "model.graph.encoded_initializer", "no encoded value of that name");
}

std::string ExampleRuntime::RoundTrip(std::string_view model, const std::string& base_dir) {
  // Explicit load then save: the model is verified (its external files included, found in base_dir),
  // then written back with every field it carried (unknown fields included).
  VerifiedModel verified = VerifyModel(model, base_dir);
  std::string saved;
  if (!verified.model->SerializeToString(&saved)) throw std::runtime_error("the model could not be serialized");
  return saved;
}

onnx_light::testee::StateId ExampleRuntime::OpenState(std::string_view model,
                                                     const onnx_light::testee::NamedValues& initial,
                                                     const std::string& base_dir) {
  return states_.Open(model, initial, base_dir);
}

onnx_light::testee::NamedValues ExampleRuntime::Run(onnx_light::testee::StateId state,
                                                    const onnx_light::testee::NamedValues& feeds,
                                                    const onnx_light::testee::RunOptions& options) {
  return states_.Run(state, feeds, options);
}

onnx_light::testee::NamedValues ExampleRuntime::Values(onnx_light::testee::StateId state) { return states_.Values(state); }

void ExampleRuntime::Reset(onnx_light::testee::StateId state, const onnx_light::testee::NamedValues& initial) {
  states_.Reset(state, initial);
}

void ExampleRuntime::Close(onnx_light::testee::StateId state) { states_.Close(state); }

std::map<std::string, std::int64_t> ExampleRuntime::Counters(onnx_light::testee::StateId state) {
  return states_.Counters(state);
}

std::string ExampleRuntime::Rewrite(std::string_view model, const std::string& rewrite_json, const std::string&) {
  return RewriteModel(model, rewrite_json);
}

}  // namespace example
