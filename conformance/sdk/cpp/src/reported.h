// The buffers each state reported, kept until the state closes.
//
// An address is an identity only while its memory cannot be reused, so everything a state reported (or
// received: the request its views point into) stays alive until the state closes. The record also
// answers a value the runner hands back (has_buffer_id): the buffer this testee reported under that id,
// when the request's copy reproduces it exactly, so the runtime gets its own buffer back as an in-process
// caller would give it. A runner's id never makes the runtime read other bytes than the runner sent.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "onnx_light_testee/sdk.h"

namespace onnx_light::testee::internal {

// What one response reported: owners to keep, and each leaf tensor or encoded value under its id.
struct Reports {
  std::vector<std::shared_ptr<const void>> owners;
  std::vector<std::pair<std::uint64_t, Value>> leaves;
};

class Reported {
 public:
  void Keep(StateId state, Reports reports);
  // The state closed: its buffers may go (and their addresses be reused).
  void Forget(StateId state);
  // The latest buffer any open state reported under `id` whose contents `copy` reproduces (kind, dtype,
  // shape, strides, bytes; an encoded value's header too), with its owner; nullopt otherwise.
  std::optional<Value> Find(std::uint64_t id, const Value& copy);

 private:
  struct Kept {
    std::vector<std::shared_ptr<const void>> owners;
    std::multimap<std::uint64_t, Value> leaves;
  };
  std::mutex mutex_;
  std::map<StateId, Kept> states_;
};

// Whether `copy` holds exactly the contents of `original` (both tensors or both encoded values).
bool SameContents(const Value& original, const Value& copy);

}  // namespace onnx_light::testee::internal
