// Request-local states over graph-declared bindings (spec: "Persistent state from model inputs and
// outputs", "Minimal rules", "Zero-copy ownership from the first state implementation"). make_state
// resolves the bindings once; each call validates its feeds, runs the graph, validates the values to
// retain and only then publishes them in one step. Retained values are the very buffers the graph
// produced or was fed (owners shared, payloads never copied). One call at a time per state: a second
// call, reset or close while one is active is refused with STATE_BUSY.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "onnx_light_testee/sdk.h"

namespace example {

struct State;

class StateTable {
 public:
  StateTable();
  ~StateTable();

  onnx_light::testee::StateId Open(std::string_view model, const onnx_light::testee::NamedValues& initial,
                                   const std::string& base_dir);
  onnx_light::testee::NamedValues Run(onnx_light::testee::StateId id, const onnx_light::testee::NamedValues& feeds,
                                      const onnx_light::testee::RunOptions& options);
  onnx_light::testee::NamedValues Values(onnx_light::testee::StateId id);
  void Reset(onnx_light::testee::StateId id, const onnx_light::testee::NamedValues& initial);
  void Close(onnx_light::testee::StateId id);
  std::map<std::string, std::int64_t> Counters(onnx_light::testee::StateId id);

 private:
  std::shared_ptr<State> Find(onnx_light::testee::StateId id);

  std::mutex mutex_;
  onnx_light::testee::StateId next_ = 1;
  std::map<onnx_light::testee::StateId, std::shared_ptr<State>> states_;
};

}  // namespace example
