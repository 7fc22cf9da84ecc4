#include "framing.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

namespace onnx_light::testee::internal {
namespace {

constexpr std::size_t kChunk = std::size_t{1} << 24;  // grow the body 16 MiB at a time

// Reads up to `count` bytes; returns how many arrived before the end of the stream, or -1 on error.
long ReadFully(int fd, char* out, std::size_t count) {
  std::size_t done = 0;
  while (done < count) {
    ssize_t got = ::read(fd, out + done, count - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return static_cast<long>(done);
}

}  // namespace

ReadResult ReadFrame(int fd, std::uint32_t max_bytes, std::string* body) {
  unsigned char header[4];
  long got = ReadFully(fd, reinterpret_cast<char*>(header), sizeof header);
  if (got < 0) return {ReadStatus::kError};
  if (got == 0) return {ReadStatus::kEnd};
  if (got < 4) return {ReadStatus::kTruncated};
  std::uint32_t length = std::uint32_t{header[0]} | std::uint32_t{header[1]} << 8 |
                         std::uint32_t{header[2]} << 16 | std::uint32_t{header[3]} << 24;
  if (length > max_bytes) return {ReadStatus::kOversized, length};
  body->clear();
  while (body->size() < length) {
    std::size_t start = body->size();
    std::size_t step = std::min<std::size_t>(kChunk, length - start);
    body->resize(start + step);
    got = ReadFully(fd, body->data() + start, step);
    if (got < 0) return {ReadStatus::kError, length};
    if (static_cast<std::size_t>(got) < step) return {ReadStatus::kTruncated, length};
  }
  return {ReadStatus::kFrame, length};
}

bool WriteFrame(int fd, const std::string& body) {
  if (body.size() > 0xFFFFFFFFu) return false;
  auto length = static_cast<std::uint32_t>(body.size());
  std::string frame;
  frame.reserve(4 + body.size());
  for (int shift = 0; shift < 32; shift += 8) frame.push_back(static_cast<char>((length >> shift) & 0xFF));
  frame += body;
  std::size_t done = 0;
  while (done < frame.size()) {
    ssize_t put = ::write(fd, frame.data() + done, frame.size() - done);
    if (put < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    done += static_cast<std::size_t>(put);
  }
  return true;
}

}  // namespace onnx_light::testee::internal
