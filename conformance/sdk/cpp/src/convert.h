// Conversion between protocol values (testee.proto) and the SDK's plain Value view.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "onnx_light_testee/sdk.h"
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

// A view of `proto`; tensor and payload bytes point into it and `owner` keeps them alive. Incoming
// buffers get their data address as buffer_id (0 for empty ones), the identity echoed in `received`.
Value FromProto(const pb::Value& proto, const std::shared_ptr<const void>& owner);
NamedValues FromProto(const google::protobuf::RepeatedPtrField<pb::NamedValue>& named,
                      const std::shared_ptr<const void>& owner);

// Fills `out`. Without data only shapes, dtypes and buffer ids travel (the `received` echo). Owners of
// reported buffers are appended to `keep` so their addresses cannot be reused while the state is open.
// Throws std::logic_error when a runtime's value is inconsistent (bytes that do not match the shape).
void ToProto(const Value& value, pb::Value* out, bool with_data, std::vector<std::shared_ptr<const void>>* keep);
void ToProto(const NamedValues& values, google::protobuf::RepeatedPtrField<pb::NamedValue>* out, bool with_data,
             std::vector<std::shared_ptr<const void>>* keep);

}  // namespace onnx_light::testee::internal
