#include "state.h"

#include <set>
#include <utility>

#include "bindings.h"
#include "common.h"
#include "graph.h"
#include "model.h"

namespace example {

using onnx_light::testee::NamedValues;
using onnx_light::testee::Rejected;
using onnx_light::testee::StateId;
using onnx_light::testee::Value;

struct State {
  Program program;
  Bindings bindings;
  std::mutex mutex;  // guards everything below
  bool busy = false;
  bool closed = false;
  Scope retained;  // bound input -> the value the next call receives
  std::int64_t binding_resolutions = 0;
};

namespace {

// Handed out read-only: inputs, retained state and returned views may alias one payload.
Value ReadOnly(Value value) {
  if (value.kind == Value::Kind::kTensor || value.kind == Value::Kind::kEncoded) value.read_only = true;
  for (auto& field : value.fields) field.second = ReadOnly(std::move(field.second));
  for (Value& item : value.items) item = ReadOnly(std::move(item));
  return value;
}

// The initial values of open and reset: exactly the bound inputs, each fitting its declaration, each
// retainable as it is (the caller's buffer becomes the state without a copy).
Scope InitialValues(const State& state, const NamedValues& initial) {
  Scope values;
  for (const auto& [name, value] : initial) {
    if (!state.bindings.Bound(name)) Fail("STATE_INITIAL_UNKNOWN", "initial", name + " is not a bound input");
    if (!values.emplace(name, value).second) Fail("STATE_INITIAL_UNKNOWN", "initial", name + " is given twice");
  }
  for (const auto& [input, output] : state.bindings.pairs) {
    auto found = values.find(input);
    if (found == values.end()) Fail("STATE_INITIAL_MISSING", "initial", "no initial value for " + input);
    if (HoldsString(found->second, *state.program.catalogue)) {
      Fail("BINDING_STRING", "initial." + input, "a string tensor cannot be persistent");
    }
    if (HoldsOwnerless(found->second)) {
      Fail("OWNERLESS_BORROW", "initial." + input, "a buffer lent for one call cannot become retained state");
    }
    const std::string why = Mismatch(found->second, state.bindings.inputs.at(input), *state.program.catalogue, true);
    if (!why.empty()) Fail("STATE_VALUE_INCOMPATIBLE", "initial." + input, why);
  }
  return values;
}

// Marks the state busy for one call; the call that finds it busy or closed is refused.
class Active {
 public:
  explicit Active(State& state) : state_(state) {
    std::lock_guard<std::mutex> lock(state_.mutex);
    if (state_.closed) Fail("STATE_CLOSED", "state", "the state is closed");
    if (state_.busy) Fail("STATE_BUSY", "state", "a call is already active on this state");
    state_.busy = true;
  }
  ~Active() {
    std::lock_guard<std::mutex> lock(state_.mutex);
    state_.busy = false;
  }
  Active(const Active&) = delete;
  Active& operator=(const Active&) = delete;

 private:
  State& state_;
};

}  // namespace

StateTable::StateTable() = default;
StateTable::~StateTable() = default;

std::shared_ptr<State> StateTable::Find(StateId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = states_.find(id);
  if (found == states_.end()) Fail("STATE_CLOSED", "state " + std::to_string(id), "no open state of that id");
  return found->second;
}

StateId StateTable::Open(std::string_view model, const NamedValues& initial, const std::string& base_dir) {
  VerifiedModel verified = VerifyModel(model, base_dir);
  auto state = std::make_shared<State>();
  state->program.model = verified.model;
  state->program.catalogue = std::move(verified.catalogue);
  for (const onnx::FunctionProto& function : verified.model->functions()) {
    state->program.functions[{function.domain(), function.name()}] = &function;
  }
  state->bindings = ResolveBindings(*verified.model, *state->program.catalogue);
  state->binding_resolutions = 1;
  state->program.constants = ProgramConstants(verified.model, base_dir);
  state->retained = InitialValues(*state, initial);
  std::lock_guard<std::mutex> lock(mutex_);
  const StateId id = next_++;
  states_[id] = std::move(state);
  return id;
}

NamedValues StateTable::Run(StateId id, const NamedValues& feeds, const onnx_light::testee::RunOptions& options) {
  std::shared_ptr<State> state = Find(id);
  Active active(*state);
  if (options.cancelled) Fail("STATE_CANCELLED", "run", "cancelled before it started; the state is unchanged");
  // Feeds: graph inputs only, never a retained one, each fitting its declaration.
  const Bindings& bindings = state->bindings;
  Scope inputs;
  for (const auto& [name, value] : feeds) {
    auto declared = bindings.inputs.find(name);
    if (declared == bindings.inputs.end()) Fail("STATE_FEED_UNKNOWN", "feeds." + name, "no graph input of that name");
    if (bindings.Bound(name)) Fail("STATE_FEED_OVERRIDES", "feeds." + name, "the input is retained state");
    if (!inputs.emplace(name, value).second) Fail("STATE_FEED_UNKNOWN", "feeds." + name, "fed twice");
    const std::string why = Mismatch(value, declared->second, *state->program.catalogue, false);
    if (!why.empty()) Fail("STATE_VALUE_INCOMPATIBLE", "feeds." + name, why);
  }
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    for (const auto& [name, value] : state->retained) inputs[name] = value;
  }
  for (const auto& [name, type] : bindings.inputs) {
    if (inputs.count(name) || state->program.constants.count(name)) continue;
    if (type && type->has_optional_type()) {
      inputs[name] = Value::None();
      continue;
    }
    Fail("STATE_FEED_MISSING", "feeds." + name, "a required input has no feed");
  }
  Scope outputs;
  try {
    outputs = Execute(state->program, inputs, options.hold);
  } catch (const Rejected& error) {
    if (error.code() == "STATE_CANCELLED") throw;
    throw Rejected("STATE_RUN_FAILED", std::string("execution failed; the state is unchanged: ") + error.what(),
                   {error.code()});
  }
  // The next state, validated in full before anything is published.
  Scope next;
  for (const auto& [input, output] : bindings.pairs) {
    const Value& value = outputs.at(output);
    if (HoldsString(value, *state->program.catalogue)) {
      Fail("BINDING_STRING", "outputs." + output, "a string tensor cannot be persistent; the state is unchanged");
    }
    if (HoldsOwnerless(value)) {
      Fail("OWNERLESS_BORROW", "outputs." + output, "a buffer lent for one call cannot become retained state");
    }
    const std::string why = Mismatch(value, bindings.inputs.at(input), *state->program.catalogue, true);
    if (!why.empty()) Fail("STATE_VALUE_INCOMPATIBLE", "outputs." + output, why + "; the state is unchanged");
    next[input] = ReadOnly(value);
  }
  NamedValues returned;
  for (const onnx::ValueInfoProto& output : state->program.model->graph().output()) {
    const Value& value = outputs.at(output.name());
    if (HoldsOwnerless(value)) {
      Fail("OWNERLESS_BORROW", "outputs." + output.name(), "a buffer lent for one call cannot become an output");
    }
    returned.emplace_back(output.name(), ReadOnly(value));
  }
  std::lock_guard<std::mutex> lock(state->mutex);
  state->retained.swap(next);
  return returned;
}

NamedValues StateTable::Values(StateId id) {
  std::shared_ptr<State> state = Find(id);
  std::lock_guard<std::mutex> lock(state->mutex);
  if (state->closed) Fail("STATE_CLOSED", "state", "the state is closed");
  NamedValues values;
  for (const auto& [input, output] : state->bindings.pairs) values.emplace_back(input, ReadOnly(state->retained.at(input)));
  return values;
}

void StateTable::Reset(StateId id, const NamedValues& initial) {
  std::shared_ptr<State> state = Find(id);
  Active active(*state);
  Scope values = InitialValues(*state, initial);
  std::lock_guard<std::mutex> lock(state->mutex);
  state->retained.swap(values);
}

void StateTable::Close(StateId id) {
  std::shared_ptr<State> state = Find(id);
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->closed) return;  // closing twice releases nothing more
  }
  {
    Active active(*state);
    std::lock_guard<std::mutex> lock(state->mutex);
    state->closed = true;
    state->retained.clear();
  }
}

std::map<std::string, std::int64_t> StateTable::Counters(StateId id) {
  std::shared_ptr<State> state = Find(id);
  std::lock_guard<std::mutex> lock(state->mutex);
  // Nothing here serializes the model or copies a payload to keep or hand over state.
  return {{"model_serializations", 0}, {"binding_resolutions", state->binding_resolutions}, {"payload_bytes_copied", 0}};
}

}  // namespace example
