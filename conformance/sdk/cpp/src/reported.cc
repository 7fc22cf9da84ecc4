#include "reported.h"

#include <cstring>

namespace onnx_light::testee::internal {

void Reported::Keep(StateId state, Reports reports) {
  std::lock_guard<std::mutex> lock(mutex_);
  Kept& kept = states_[state];
  for (auto& owner : reports.owners) kept.owners.push_back(std::move(owner));
  for (auto& [id, leaf] : reports.leaves) kept.leaves.emplace(id, std::move(leaf));
}

void Reported::Forget(StateId state) {
  Kept released;  // destroyed outside the lock: a runtime's owner may do anything in its destructor
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = states_.find(state);
  if (found == states_.end()) return;
  released = std::move(found->second);
  states_.erase(found);
}

std::optional<Value> Reported::Find(std::uint64_t id, const Value& copy) {
  std::vector<Value> candidates;  // copies hold their owners, so they stay valid outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [state, kept] : states_) {
      auto [begin, end] = kept.leaves.equal_range(id);
      for (auto it = begin; it != end; ++it) candidates.push_back(it->second);
    }
  }
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    if (SameContents(*it, copy)) return *it;
  }
  return std::nullopt;
}

bool SameContents(const Value& original, const Value& copy) {
  if (original.kind != copy.kind) return false;
  if (original.kind == Value::Kind::kEncoded && original.header != copy.header) return false;
  if (original.kind == Value::Kind::kTensor &&
      (original.dtype != copy.dtype || original.shape != copy.shape || original.strides != copy.strides ||
       original.strings != copy.strings)) {
    return false;
  }
  if (original.kind != Value::Kind::kTensor && original.kind != Value::Kind::kEncoded) return false;
  if (original.size != copy.size) return false;
  return original.size == 0 || std::memcmp(original.data, copy.data, original.size) == 0;
}

}  // namespace onnx_light::testee::internal
