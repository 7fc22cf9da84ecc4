#include "payload.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>

#include "common.h"

namespace example {
namespace {

// A decimal uint64 written with digits only (no sign, space, prefix or exponent).
std::uint64_t Decimal(const std::string& text, const std::string& path) {
  if (text.empty()) Fail("EXTERNAL_NUMBER_INVALID", path, "an empty string is not a decimal integer");
  std::uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') Fail("EXTERNAL_NUMBER_INVALID", path, "'" + text + "' is not a decimal integer");
    auto shifted = CheckedMul(value, 10);
    auto next = shifted ? CheckedAdd(*shifted, static_cast<std::uint64_t>(c - '0')) : std::nullopt;
    if (!next) Fail("EXTERNAL_NUMBER_INVALID", path, text + " exceeds uint64");
    value = *next;
  }
  return value;
}

// The location is a relative path naming a file inside the model directory.
void CheckLocation(const std::string& location, const std::string& path) {
  if (!onnx_light::testee::IsValidUtf8(location)) Fail("EXTERNAL_PATH_INVALID", path, "location is not valid UTF-8 text");
  if (location.find('\0') != std::string::npos) {
    Fail("EXTERNAL_PATH_INVALID", path, "location contains a NUL character");
  }
  std::string normalized = location;
  for (char& c : normalized) {
    if (c == '\\') c = '/';
  }
  const bool drive = normalized.size() >= 2 && normalized[1] == ':' &&
                     ((normalized[0] >= 'A' && normalized[0] <= 'Z') || (normalized[0] >= 'a' && normalized[0] <= 'z'));
  if (normalized.front() == '/' || drive) Fail("EXTERNAL_PATH_INVALID", path, "location '" + location + "' is absolute");
  std::size_t start = 0;
  while (start <= normalized.size()) {
    std::size_t end = normalized.find('/', start);
    if (end == std::string::npos) end = normalized.size();
    if (normalized.compare(start, end - start, "..") == 0) {
      Fail("EXTERNAL_PATH_INVALID", path, "location '" + location + "' escapes the model directory");
    }
    start = end + 1;
  }
  std::string trimmed = normalized;
  while (!trimmed.empty() && trimmed.back() == '/') trimmed.pop_back();
  if (trimmed.empty() || trimmed == ".") Fail("EXTERNAL_PATH_INVALID", path, "location '" + location + "' names no file");
}

std::string RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) ? std::string(resolved) : std::string();
}

// The backing file's resolved path after the containment and extent checks.
std::string ResolveFile(const Extent& extent, const std::string& base_dir, const std::string& path) {
  if (base_dir.empty()) Fail("EXTERNAL_FILE_INVALID", path, "an external payload needs a base directory");
  std::string base = RealPath(base_dir);
  if (base.empty()) Fail("EXTERNAL_FILE_INVALID", path, "the model directory cannot be resolved");
  std::string relative = extent.location;
  for (char& c : relative) {
    if (c == '\\') c = '/';
  }
  std::string target = RealPath(base + "/" + relative);
  if (target.empty()) Fail("EXTERNAL_FILE_INVALID", path, "backing file '" + extent.location + "' does not exist");
  if (target != base && target.compare(0, base.size() + 1, base + "/") != 0) {
    Fail("EXTERNAL_PATH_INVALID", path, "'" + extent.location + "' resolves outside the model directory");
  }
  struct stat info;
  if (::stat(target.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
    Fail("EXTERNAL_FILE_INVALID", path, "backing file '" + extent.location + "' is not a regular file");
  }
  if (static_cast<std::uint64_t>(info.st_size) < extent.offset + extent.length) {
    Fail("EXTERNAL_FILE_INVALID", path,
         "backing file has " + std::to_string(info.st_size) + " bytes; the extent ends at " +
             std::to_string(extent.offset + extent.length));
  }
  return target;
}

}  // namespace

Extent PayloadExtent(const onnx::EncodedValueProto& value, const std::string& path) {
  const bool has_raw = value.has_raw_data();
  if (has_raw && value.external_data_size() > 0) {
    Fail("PAYLOAD_BOTH", path, "raw_data and external_data are mutually exclusive");
  }
  Extent extent;
  if (value.data_location() != onnx::TensorProto::EXTERNAL) {
    if (value.external_data_size() > 0) {
      Fail("PAYLOAD_LOCATION_MISMATCH", path + ".external_data", "external_data requires data_location EXTERNAL");
    }
    extent.length = value.raw_data().size();
    return extent;
  }
  if (has_raw) Fail("PAYLOAD_BOTH", path + ".raw_data", "an EXTERNAL payload cannot also carry raw_data");
  std::map<std::string, std::string> entries;
  for (int i = 0; i < value.external_data_size(); ++i) {
    const onnx::StringStringEntryProto& entry = value.external_data(i);
    const std::string entry_path = path + ".external_data[" + std::to_string(i) + "]";
    const std::string& key = entry.key();
    if (key != "location" && key != "offset" && key != "length" && key != "checksum") {
      Fail("EXTERNAL_KEY_INVALID", entry_path, "unknown external_data key '" + key + "'");
    }
    if (!entries.emplace(key, entry.value()).second) {
      Fail("EXTERNAL_KEY_INVALID", entry_path, "external_data key '" + key + "' repeats");
    }
  }
  auto location = entries.find("location");
  if (location == entries.end() || location->second.empty()) {
    Fail("EXTERNAL_LOCATION_MISSING", path + ".external_data", "EXTERNAL requires a location");
  }
  auto length = entries.find("length");
  if (length == entries.end()) {
    Fail("EXTERNAL_LENGTH_MISSING", path + ".external_data", "EXTERNAL requires an explicit length");
  }
  CheckLocation(location->second, path + ".external_data.location");
  extent.external = true;
  extent.location = location->second;
  extent.length = Decimal(length->second, path + ".external_data.length");
  auto offset = entries.find("offset");
  extent.offset = offset == entries.end() ? 0 : Decimal(offset->second, path + ".external_data.offset");
  if (!CheckedAdd(extent.offset, extent.length)) {
    Fail("EXTERNAL_EXTENT_OVERFLOW", path + ".external_data", "offset + length overflows uint64");
  }
  return extent;
}

void CheckFile(const Extent& extent, const std::string& base_dir, const std::string& path) {
  if (extent.external && !base_dir.empty()) ResolveFile(extent, base_dir, path);
}

Payload OpenPayload(const onnx::EncodedValueProto& value, const Extent& extent, const std::string& base_dir,
                    const std::string& path, std::shared_ptr<const void> message_owner) {
  Payload payload;
  if (!extent.external) {
    payload.data = reinterpret_cast<const std::uint8_t*>(value.raw_data().data());
    payload.size = value.raw_data().size();
    payload.owner = std::move(message_owner);
    return payload;
  }
  std::string file = ResolveFile(extent, base_dir, path);
  if (extent.length == 0) return payload;
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail("EXTERNAL_FILE_INVALID", path, "backing file '" + extent.location + "' cannot be opened");
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t start = extent.offset - extent.offset % page;
  const std::uint64_t span = extent.offset + extent.length - start;
  void* mapped = ::mmap(nullptr, span, PROT_READ, MAP_PRIVATE, fd, static_cast<off_t>(start));
  ::close(fd);
  if (mapped == MAP_FAILED) Fail("EXTERNAL_FILE_INVALID", path, "backing file '" + extent.location + "' cannot be mapped");
  // The mapping is the bytes' owner: it is released when the last view of the payload goes.
  payload.owner = std::shared_ptr<const void>(mapped, [span](const void* address) {
    ::munmap(const_cast<void*>(address), span);
  });
  payload.data = static_cast<const std::uint8_t*>(mapped) + (extent.offset - start);
  payload.size = extent.length;
  return payload;
}

}  // namespace example
