// The C++ testee SDK: everything a native runtime needs to be judged by the onnx-light conformance
// suite through the testee protocol (conformance/testee.proto, docs/testee-protocol.md).
//
// A vendor implements one class, `Runtime`, and calls `Serve(runtime)` from main(). The SDK owns the
// framing on stdin/stdout, the hello exchange, request dispatch on worker threads, the conversion
// between protocol values and the plain `Value` view below, the `received` echoes and the rule that a
// buffer_id names one buffer for the whole life of its state, held runs (Run.hold and the Hold request) and
// the hello's features. Every Runtime method except GetHello() answers NotSupported until it is overridden.
//
// conformance/sdk/cpp/PROTOCOL.md lists every message and field of the protocol and what the SDK does with
// it; tests/test_native_protocol_parity.py fails when the protocol gains one the table does not list.
//
// Failures travel as exceptions: throw `Rejected` for a verdict of the contract (with one of the
// suite's error codes), `NotSupported` for something the runtime does not do; anything else becomes
// an InternalError reply (the case fails) and the testee keeps serving.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace onnx_light::testee {

// The protocol version this SDK speaks, the runner's (conformance/protocol.py, PROTOCOL_VERSION): 2 added
// Run.cancelled; 3 names as bytes, Rejection.causes and Counters; 4 held runs (Run.hold, Hold); 5 the
// base_dir of RoundTrip, Export and Rewrite.
inline constexpr std::uint32_t kProtocolVersion = 5;

// HelloResult.features the SDK knows. It lists a feature only when the runtime has it (see
// Runtime::SupportsHeldRuns); the runner never uses a feature that is not listed.
inline constexpr const char kHoldFeature[] = "hold";

// ------------------------------------------------------------------------------------------ values

// One value crossing the protocol. `kind` says which members are meaningful.
//
// Tensors arrive as views: `data` points into the request the SDK received and `owner` keeps that
// memory alive, so a runtime can retain an input without copying it (keep `owner` with the view).
// A runtime returning a tensor sets `data`/`size` to its own buffer and `owner` to whatever keeps that
// buffer alive; the SDK copies the bytes into the response and holds `owner` until the state closes.
//
// A value the runner hands back (an output fed to another call, a retained value given to reset) arrives
// as the runtime's own buffer when the SDK still holds it and the request's bytes are its bytes, as an
// in-process caller would hand back its object; otherwise as the request's copy. `reported_id` says
// which id the runner named either way.
struct Value {
  enum class Kind { kNone, kTensor, kStruct, kSequence, kEncoded };
  Kind kind = Kind::kNone;

  // kTensor: dtype is a NumPy name ("float32", "int64", "bool", "float16", "bfloat16", ...), or "str"
  // (UTF-8 text) and "bytes" (ONNX strings) whose elements are in `strings`.
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // element strides; empty for row-major contiguous data
  std::vector<std::string> strings;
  // kTensor and kEncoded: the buffer is handed out read-only (Tensor.read_only, Encoded.read_only).
  bool read_only = false;
  // kTensor in a request: the caller lends this buffer for the one call only (Tensor.ownerless), like a
  // raw pointer without an owner: `owner` is empty, and the buffer must never become a returned output or
  // retained state (nor be repaired by a copy).
  bool ownerless = false;

  // kTensor and kEncoded: the bytes (little-endian elements, or the covering span when strided; the
  // payload of an encoded value), their owner, and the identity of the memory holding them.
  // buffer_id 0 means "the data address": the SDK reports the address and keeps `owner` alive. A value
  // is reported with an identity (has_buffer_id) when buffer_id is set or its buffer is not empty.
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  std::shared_ptr<const void> owner;
  std::uint64_t buffer_id = 0;
  // In a request: the buffer_id this testee reported for the buffer the runner hands back (the request's
  // has_buffer_id), whether or not the SDK still held that buffer. Empty for the runner's own values.
  std::optional<std::uint64_t> reported_id;

  // kStruct: named fields (names are bytes) and the catalogue type_id when the value has one.
  std::vector<std::pair<std::string, Value>> fields;
  std::optional<std::uint64_t> type_id;

  // kSequence
  std::vector<Value> items;

  // kEncoded: a serialized onnx.EncodedValueProto without raw_data; the payload is data/size.
  std::string header;

  static Value None();
  // A tensor owning `bytes` (moved into a shared buffer that is the value's owner).
  static Value Tensor(std::string dtype, std::vector<std::int64_t> shape, std::vector<std::uint8_t> bytes);
  // A tensor viewing memory that `owner` keeps alive.
  static Value TensorView(std::string dtype, std::vector<std::int64_t> shape, const void* data,
                          std::size_t size, std::shared_ptr<const void> owner);
  static Value Encoded(std::string header, std::vector<std::uint8_t> payload);
  static Value Struct(std::vector<std::pair<std::string, Value>> fields,
                      std::optional<std::uint64_t> type_id = std::nullopt);
  static Value Sequence(std::vector<Value> items);

  // Elements of a tensor (the product of its shape; 1 for a scalar).
  std::uint64_t element_count() const;
};

// Values in protocol order; names are bytes (a model's names need not be valid UTF-8).
using NamedValues = std::vector<std::pair<std::string, Value>>;

// Bytes per element of a fixed-width dtype name, or 0 when the name is not one.
std::size_t ItemSize(std::string_view dtype);

// Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF). Names are bytes: decode
// them as text only when they pass. Text fields of the protocol (messages, dtypes, "str" elements)
// must pass too; the SDK escapes invalid bytes in messages and rejects them elsewhere.
bool IsValidUtf8(std::string_view text);

// ------------------------------------------------------------------------------------ verdicts

// A verdict of the contract. `code` is one of the suite's error codes (docs/error-codes.md), or empty
// when the runtime has no mapping; `causes` optionally names what made a wrapping failure happen.
class Rejected : public std::runtime_error {
 public:
  Rejected(std::string code, const std::string& message, std::vector<std::string> causes = {})
      : std::runtime_error(message), code_(std::move(code)), causes_(std::move(causes)) {}
  const std::string& code() const { return code_; }
  const std::vector<std::string>& causes() const { return causes_; }

 private:
  std::string code_;
  std::vector<std::string> causes_;
};

// The runtime does not support what was asked: its own verdict, never a failure.
class NotSupported : public std::runtime_error {
 public:
  explicit NotSupported(const std::string& reason) : std::runtime_error(reason) {}
};

// ------------------------------------------------------------------------------------ the runtime

struct OperatorRole {
  std::string role, domain, op_type;
};

struct Hello {
  std::string name;
  std::string version;
  std::vector<std::string> profiles;  // the profiles the runtime claims (docs/conformance.md)
  std::vector<OperatorRole> operators;
};

// A run the runner holds open at its model's Hold node (Run.hold; docs/testee-protocol.md, "Held runs"):
// node { op_type: "Hold" domain: "onnx_light.conformance" } is an identity; on a held run, the runtime's
// kernel for it calls Park(), so the call is certainly active while the runner issues a second call or
// requests cancellation. The SDK implements it; a runtime only calls it.
class HeldRun {
 public:
  virtual ~HeldRun() = default;
  // Reports the call active (parked) and blocks until the runner releases it. Returns whether the runner
  // requested cancellation meanwhile: the run then ends with Rejected("STATE_CANCELLED") and leaves the
  // state as it was (or completes, if the runtime only checks for cancellation before this point).
  virtual bool Park() = 0;
  // How the runtime cancels this call when the runner asks; called at once when it already has. It runs on
  // the thread handling the runner's request, possibly as the call returns: capture what it touches by
  // value (a shared_ptr), not by reference to the call's locals.
  virtual void OnCancel(std::function<void()> cancel) = 0;
  virtual bool cancel_requested() const = 0;
};

// What a Run request asks besides its feeds.
struct RunOptions {
  // Cancellation was requested before the call started (Run.cancelled): reject with STATE_CANCELLED and
  // leave the state as it was.
  bool cancelled = false;
  // Run.hold: park at the model's Hold node (nullptr on an ordinary run, and always when the runtime does
  // not support held runs).
  HeldRun* hold = nullptr;
};

struct ExportResult {
  std::string model;  // serialized ModelProto
  // For target "onnx-lowered": the caller-managed feedback (input, output) pairs.
  std::optional<std::vector<std::pair<std::string, std::string>>> feedback;
};

using StateId = std::uint64_t;

// The one interface a vendor implements. Models arrive serialized (parse them with the runtime's own
// loader); `base_dir` is the directory holding a model's external payload files ("" when none).
// Methods may be called concurrently from several threads, including two calls on one state (the
// suite checks that the second is rejected with STATE_BUSY).
class Runtime {
 public:
  virtual ~Runtime() = default;

  virtual Hello GetHello() = 0;
  // Whether Run(state, feeds, RunOptions) parks a held run at the Hold node. The hello lists the "hold"
  // feature only when this is true; otherwise the runner never sends a held run and the cases that need
  // one (concurrency and cancellation of active calls) are "not supported".
  virtual bool SupportsHeldRuns();

  virtual void Verify(std::string_view model, const std::string& base_dir);
  virtual Value Decode(std::string_view model, const std::string& value_name, const std::string& base_dir);
  virtual NamedValues ReadFields(std::string_view model, const std::string& value_name,
                                 const std::string& base_dir);
  // Explicit load then save. The SDK calls this form; its default calls the one without base_dir, which
  // runtimes written before RoundTrip, Export and Rewrite had base_dir override (those keep working; a
  // runtime overriding one form adds `using Runtime::RoundTrip;` to keep the other visible).
  virtual std::string RoundTrip(std::string_view model, const std::string& base_dir);
  virtual std::string RoundTrip(std::string_view model);

  // States: the runtime chooses the id; the SDK echoes `received` for the initial values and feeds.
  virtual StateId OpenState(std::string_view model, const NamedValues& initial, const std::string& base_dir);
  // The SDK calls the form with RunOptions; its default calls the one with `cancelled` (runtimes written
  // before held runs override that one and keep working). A runtime with held runs overrides this form and
  // SupportsHeldRuns() (add `using Runtime::Run;` to keep the other form visible).
  virtual NamedValues Run(StateId state, const NamedValues& feeds, const RunOptions& options);
  virtual NamedValues Run(StateId state, const NamedValues& feeds, bool cancelled);
  virtual NamedValues Values(StateId state);
  virtual void Reset(StateId state, const NamedValues& initial);
  virtual void Close(StateId state);
  virtual std::map<std::string, std::int64_t> Counters(StateId state);

  // Export and Rewrite have two forms each, like RoundTrip: the SDK calls the one with base_dir.
  virtual ExportResult Export(std::string_view model, const std::string& target, const std::string& base_dir);
  virtual ExportResult Export(std::string_view model, const std::string& target);
  // rewrite_json: {"kind": "rename", "old": ..., "new": ...} and the other kinds in the docs.
  virtual std::string Rewrite(std::string_view model, const std::string& rewrite_json, const std::string& base_dir);
  virtual std::string Rewrite(std::string_view model, const std::string& rewrite_json);
};

// ------------------------------------------------------------------------------------ serving

struct ServeOptions {
  int input_fd = 0;
  int output_fd = 1;
  // Requests are handled on this many threads (at least 2: the suite issues a second call on a busy state).
  int workers = 8;
  // A frame longer than this is answered with an InternalError and ends the session (exit status 2).
  std::uint32_t max_frame_bytes = 1u << 30;
  // Make fd 1 an alias of stderr after taking the protocol stream, so stray prints cannot corrupt it.
  bool guard_stdout = true;
};

// Serve requests until shutdown or end of input. Returns the process exit status: 0 after shutdown
// or a clean end of input, 2 after a protocol error (truncated or oversized frame), 3 when the
// output stream fails.
int Serve(Runtime& runtime, const ServeOptions& options = {});

}  // namespace onnx_light::testee
