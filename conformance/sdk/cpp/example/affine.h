// The closed affine branch (spec: "Struct types and byte-encodable layouts"): INT8/UINT8/INT4/UINT4/
// INT2/UINT2 codes with a floating scale and an optional zero point, per tensor, per axis or blocked,
// decoded as ONNX DequantizeLinear: (code - zero_point) * scale, in the scale's element type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "onnx-light.pb.h"
#include "onnx_light_testee/sdk.h"
#include "payload.h"

namespace example {

// What verification established about one affine value.
struct AffineInfo {
  int element_type = 0;              // FLOAT, FLOAT16, BFLOAT16 or DOUBLE (the scale's type)
  std::vector<std::int64_t> shape;   // the logical dims
  std::uint64_t count = 0;           // logical elements
  std::uint64_t code_bits = 0;       // count * bit width of the storage type
};

// Every affine rule that the message and the payload extent decide (inline padding bits included).
AffineInfo VerifyAffine(const onnx::EncodedValueProto& value, const Extent& extent, const std::string& path);

// The logical tensor. `payload` holds exactly the code bytes VerifyAffine accepted.
onnx_light::testee::Value DecodeAffine(const onnx::EncodedValueProto& value, const AffineInfo& info,
                                       const Payload& payload, const std::string& path);

}  // namespace example
