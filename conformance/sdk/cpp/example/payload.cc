#include "payload.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <vector>

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

// A descriptor closed when it goes out of scope.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Why opening `name` in `directory` failed: a symbolic link (refused wherever it points) or another reason.
[[noreturn]] void FailOpen(int directory, const std::string& name, int error, const Extent& extent,
                           const std::string& path) {
  struct stat info;
  const bool link = error == ELOOP || (::fstatat(directory, name.c_str(), &info, AT_SYMLINK_NOFOLLOW) == 0 &&
                                       S_ISLNK(info.st_mode));
  if (link) {
    Fail("EXTERNAL_PATH_INVALID", path,
         "'" + extent.location + "' passes through the symbolic link '" + name +
             "'; links are not followed out of (or within) the model directory");
  }
  if (error == ENOENT) Fail("EXTERNAL_FILE_INVALID", path, "backing file '" + extent.location + "' does not exist");
  Fail("EXTERNAL_FILE_INVALID", path,
       "backing file '" + extent.location + "' cannot be opened inside the model directory: " + std::strerror(error));
}

// The backing file, opened race-free inside base_dir: every component of the location is opened relative
// to the directory opened before it with O_NOFOLLOW (O_DIRECTORY for all but the last; O_NONBLOCK for the
// last, so a planted FIFO cannot block), then the descriptor itself is checked (a regular file whose size
// covers the extent). The bytes are reached only through the returned descriptor; nothing is reopened by
// name, so swapping a component for a symbolic link at any moment cannot lead outside the directory.
Descriptor OpenBackingFile(const Extent& extent, const std::string& base_dir, const std::string& path) {
  if (base_dir.empty()) Fail("EXTERNAL_FILE_INVALID", path, "an external payload needs a base directory");
  std::vector<std::string> parts;
  std::string part;
  for (char c : extent.location + "/") {
    if (c == '/' || c == '\\') {
      if (part == "..") Fail("EXTERNAL_PATH_INVALID", path, "location '" + extent.location + "' escapes the model directory");
      if (!part.empty() && part != ".") parts.push_back(part);
      part.clear();
    } else {
      part += c;
    }
  }
  if (parts.empty()) Fail("EXTERNAL_PATH_INVALID", path, "location '" + extent.location + "' names no file");
  Descriptor current(::open(base_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (current.get() < 0) Fail("EXTERNAL_FILE_INVALID", path, "the model directory cannot be opened");
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    int next = ::openat(current.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) FailOpen(current.get(), parts[i], errno, extent, path);
    current.reset(next);
  }
  Descriptor file(::openat(current.get(), parts.back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) FailOpen(current.get(), parts.back(), errno, extent, path);
  struct stat info;
  if (::fstat(file.get(), &info) != 0 || !S_ISREG(info.st_mode)) {
    Fail("EXTERNAL_FILE_INVALID", path, "backing file '" + extent.location + "' is not a regular file");
  }
  if (static_cast<std::uint64_t>(info.st_size) < extent.offset + extent.length) {
    Fail("EXTERNAL_FILE_INVALID", path,
         "backing file has " + std::to_string(info.st_size) + " bytes; the extent ends at " +
             std::to_string(extent.offset + extent.length));
  }
  return Descriptor(file.release());
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
  if (extent.external && !base_dir.empty()) OpenBackingFile(extent, base_dir, path);
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
  Descriptor file = OpenBackingFile(extent, base_dir, path);
  if (extent.length == 0) return payload;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t start = extent.offset - extent.offset % page;
  const std::uint64_t span = extent.offset + extent.length - start;
  // Mapped from the checked descriptor: the file the checks saw is the file read.
  void* mapped = ::mmap(nullptr, span, PROT_READ, MAP_PRIVATE, file.get(), static_cast<off_t>(start));
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
