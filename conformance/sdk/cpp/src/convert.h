// Conversion between protocol values (testee.proto) and the SDK's plain Value view.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "onnx_light_testee/sdk.h"
#include "reported.h"
#include "testee.pb.h"

namespace onnx_light::testee::internal {

namespace pb = ::onnx_light::conformance;

// The peer sent a value the protocol does not allow (e.g. data that does not match its shape).
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Protocol text fields are proto3 strings, which must be UTF-8 or the peer cannot parse the reply.
// Messages get their invalid bytes escaped as \xHH; other text (dtypes, profiles, counter names,
// "str" elements) that is not UTF-8 is a runtime bug and throws std::logic_error.
std::string EscapeInvalidUtf8(std::string_view text);
void RequireUtf8(std::string_view text, const char* what);

// Finds the buffer this testee reported under an id, when a copy reproduces it (Reported::Find).
using HandedBack = std::function<std::optional<Value>(std::uint64_t id, const Value& copy)>;

// A view of `proto`; tensor and payload bytes point into it and `owner` keeps them alive (except an
// ownerless tensor's, lent for the call only). Incoming buffers get their data address as buffer_id (0 for
// empty ones), the identity echoed in `received`. A leaf with has_buffer_id gets `reported_id`, and is
// replaced by the buffer `handed_back` finds for it (not for ownerless loans).
Value FromProto(const pb::Value& proto, const std::shared_ptr<const void>& owner,
                const HandedBack* handed_back = nullptr);
NamedValues FromProto(const google::protobuf::RepeatedPtrField<pb::NamedValue>& named,
                      const std::shared_ptr<const void>& owner, const HandedBack* handed_back = nullptr);

// Fills `out`. Without data only shapes, dtypes and buffer ids travel (the `received` echo). Every leaf
// reported with an identity, and its owner, is added to `reports` so the address cannot be reused while
// the state is open and the runner can hand the buffer back. Throws std::logic_error when a runtime's
// value is inconsistent (bytes that do not match the shape).
void ToProto(const Value& value, pb::Value* out, bool with_data, Reports* reports);
void ToProto(const NamedValues& values, google::protobuf::RepeatedPtrField<pb::NamedValue>* out, bool with_data,
             Reports* reports);

}  // namespace onnx_light::testee::internal
