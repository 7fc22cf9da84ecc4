// Decoders this runtime binds natively, keyed by type_id: the spec's worked examples Int4Block (2001),
// LINEAR_INT4_128_WITH_PARAMETERS (1002), LINEAR_INT4_128_FIXED_PARAMETERS (1003) and
// SCALED_CODEBOOK2_BLOCK_32 (1102). A binding verifies the model's resolved declaration (record
// layout, constants, declared codec) before it reads a record, and refuses a different declaration
// under a registered ID (DECODER_MISMATCH). Only the root type's decoder is used.
#pragma once

#include <string>

#include "catalogue.h"
#include "onnx-light.pb.h"
#include "onnx_light_testee/sdk.h"
#include "payload.h"

namespace example {

// The logical tensor of a struct-layout value whose payload and layout were verified.
// Inline layouts have no decoder (CONSUMER_MISSING). A type ID without a binding here is NotSupported:
// the structured profile, where a missing consumer is the verdict, is not one this runtime claims.
onnx_light::testee::Value DecodeRegistered(const Catalogue& catalogue, const onnx::EncodedValueProto& value,
                                           const Payload& payload, std::uint64_t record_bytes,
                                           const std::string& path);

// The flattened record layout of a resolved struct (leaves with bit offsets, then constants) and its
// declared codec: what a binding compares. Exposed for the registration table's tests.
std::string LayoutSignature(const Catalogue& catalogue, const onnx::StructTypeProto& root,
                            const std::string& path);

}  // namespace example
