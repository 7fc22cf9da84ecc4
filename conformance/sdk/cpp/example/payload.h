// Payloads of encoded values: inline raw_data or an external file extent, validated from the message
// alone (keys, decimal numbers, path safety, overflow) before any file is touched; the bytes are then
// reached through a read-only mapping that stays alive as long as the payload's owner. The backing file
// is opened one component at a time with O_NOFOLLOW and checked and mapped through that one descriptor,
// as the oracle's reference_impl/payload.py does, so a path swapped for a symbolic link mid-call cannot
// lead outside the model directory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "onnx-light.pb.h"

namespace example {

struct Extent {
  std::uint64_t length = 0;
  bool external = false;
  std::string location;  // as written; '\\' counts as a separator
  std::uint64_t offset = 0;
};

// The payload's byte extent, after the payload fields' rules (PAYLOAD_*, EXTERNAL_*).
Extent PayloadExtent(const onnx::EncodedValueProto& value, const std::string& path);

// For an external extent: the backing file is a regular file inside base_dir, reached without passing
// through a symbolic link, and covers offset + length (nothing is read). Skipped when base_dir is empty
// (no directory to resolve against).
void CheckFile(const Extent& extent, const std::string& base_dir, const std::string& path);

struct Payload {
  const std::uint8_t* data = nullptr;
  std::uint64_t size = 0;
  std::shared_ptr<const void> owner;  // the message or the file mapping
};

// The payload bytes: a view of raw_data (kept alive by `message_owner`) or a read-only file mapping.
Payload OpenPayload(const onnx::EncodedValueProto& value, const Extent& extent, const std::string& base_dir,
                    const std::string& path, std::shared_ptr<const void> message_owner);

}  // namespace example
