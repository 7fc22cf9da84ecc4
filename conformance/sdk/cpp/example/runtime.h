#pragma once

#include <string>
#include <string_view>

#include "onnx_light_testee/sdk.h"
#include "state.h"

namespace example {

// Claims the affine, external-data, state, bindings and zero-copy profiles; export and generic field access stay
// NotSupported (the SDK's defaults).
class ExampleRuntime : public onnx_light::testee::Runtime {
 public:
  onnx_light::testee::Hello GetHello() override;
  void Verify(std::string_view model, const std::string& base_dir) override;
  onnx_light::testee::Value Decode(std::string_view model, const std::string& value_name,
                                   const std::string& base_dir) override;
  using onnx_light::testee::Runtime::RoundTrip;
  std::string RoundTrip(std::string_view model, const std::string& base_dir) override;

  bool SupportsHeldRuns() override { return true; }
  onnx_light::testee::StateId OpenState(std::string_view model, const onnx_light::testee::NamedValues& initial,
                                        const std::string& base_dir) override;
  using onnx_light::testee::Runtime::Run;
  onnx_light::testee::NamedValues Run(onnx_light::testee::StateId state, const onnx_light::testee::NamedValues& feeds,
                                      const onnx_light::testee::RunOptions& options) override;
  onnx_light::testee::NamedValues Values(onnx_light::testee::StateId state) override;
  void Reset(onnx_light::testee::StateId state, const onnx_light::testee::NamedValues& initial) override;
  void Close(onnx_light::testee::StateId state) override;
  std::map<std::string, std::int64_t> Counters(onnx_light::testee::StateId state) override;
  using onnx_light::testee::Runtime::Rewrite;
  std::string Rewrite(std::string_view model, const std::string& rewrite_json, const std::string& base_dir) override;

 private:
  StateTable states_;
};

}  // namespace example
