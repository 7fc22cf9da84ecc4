#pragma once

#include <string>
#include <string_view>

#include "onnx_light_testee/sdk.h"

namespace example {

// Claims the affine and external-data profiles; state, export and generic field access stay
// NotSupported (the SDK's defaults).
class ExampleRuntime : public onnx_light::testee::Runtime {
 public:
  onnx_light::testee::Hello GetHello() override;
  void Verify(std::string_view model, const std::string& base_dir) override;
  onnx_light::testee::Value Decode(std::string_view model, const std::string& value_name,
                                   const std::string& base_dir) override;
  using onnx_light::testee::Runtime::RoundTrip;
  std::string RoundTrip(std::string_view model, const std::string& base_dir) override;
};

}  // namespace example
