// Whole-model verification: parse, catalogue, graph types, initializer names and every encoded value
// (layout, payload, backing file), in control-flow subgraphs and functions too. Nothing is decoded.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "affine.h"
#include "catalogue.h"
#include "onnx-light.pb.h"
#include "payload.h"

namespace example {

struct EncodedInfo {
  const onnx::EncodedValueProto* value = nullptr;
  std::string path;
  Extent extent;
  std::optional<AffineInfo> affine;  // affine branch
  std::uint64_t record_bytes = 0;    // struct branch
};

struct VerifiedModel {
  std::shared_ptr<const onnx::ModelProto> model;
  std::unique_ptr<Catalogue> catalogue;
  std::vector<EncodedInfo> values;  // the root graph's encoded initializers, in order
};

// One encoded value checked on its own against a model's catalogue (a value fed to a running graph).
EncodedInfo VerifyEncodedValue(const Catalogue& catalogue, const onnx::EncodedValueProto& value,
                               const std::string& base_dir, const std::string& path);

// The first violation is thrown as a Rejected; base_dir "" skips the backing-file checks.
VerifiedModel VerifyModel(std::string_view bytes, const std::string& base_dir);

}  // namespace example
