// Frames on file descriptors: a 4-byte little-endian length, then that many bytes.
#pragma once

#include <cstdint>
#include <string>

namespace onnx_light::testee::internal {

enum class ReadStatus {
  kFrame,      // `body` holds one frame
  kEnd,        // the peer closed the stream at a frame boundary
  kTruncated,  // the stream ended inside a frame
  kOversized,  // the announced length exceeds the limit (`length` says how long); nothing was read
  kError,      // read() failed
};

struct ReadResult {
  ReadStatus status;
  std::uint32_t length = 0;
};

// Reads one frame into `body`. Memory grows with the bytes that actually arrive, so a lying length
// followed by the end of the stream costs no large allocation.
ReadResult ReadFrame(int fd, std::uint32_t max_bytes, std::string* body);

// Writes one frame; false when the stream is gone.
bool WriteFrame(int fd, const std::string& body);

}  // namespace onnx_light::testee::internal
