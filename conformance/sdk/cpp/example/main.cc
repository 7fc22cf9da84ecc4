// onnx-light-example-testee: the example runtime behind the testee protocol on stdin/stdout.
#include "onnx_light_testee/sdk.h"
#include "runtime.h"

int main() {
  example::ExampleRuntime runtime;
  return onnx_light::testee::Serve(runtime);
}
