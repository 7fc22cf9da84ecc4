// Value factories and dtype sizes.
#include <stdexcept>
#include <utility>

#include "onnx_light_testee/sdk.h"

namespace onnx_light::testee {

Value Value::None() { return Value{}; }

Value Value::Tensor(std::string dtype, std::vector<std::int64_t> shape, std::vector<std::uint8_t> bytes) {
  auto buffer = std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes));
  return TensorView(std::move(dtype), std::move(shape), buffer->data(), buffer->size(), buffer);
}

Value Value::TensorView(std::string dtype, std::vector<std::int64_t> shape, const void* data, std::size_t size,
                        std::shared_ptr<const void> owner) {
  Value value;
  value.kind = Kind::kTensor;
  value.dtype = std::move(dtype);
  value.shape = std::move(shape);
  value.data = static_cast<const std::uint8_t*>(data);
  value.size = size;
  value.owner = std::move(owner);
  return value;
}

Value Value::Encoded(std::string header, std::vector<std::uint8_t> payload) {
  auto buffer = std::make_shared<const std::vector<std::uint8_t>>(std::move(payload));
  Value value;
  value.kind = Kind::kEncoded;
  value.header = std::move(header);
  value.data = buffer->data();
  value.size = buffer->size();
  value.owner = std::move(buffer);
  return value;
}

Value Value::Struct(std::vector<std::pair<std::string, Value>> fields, std::optional<std::uint64_t> type_id) {
  Value value;
  value.kind = Kind::kStruct;
  value.fields = std::move(fields);
  value.type_id = type_id;
  return value;
}

Value Value::Sequence(std::vector<Value> items) {
  Value value;
  value.kind = Kind::kSequence;
  value.items = std::move(items);
  return value;
}

std::uint64_t Value::element_count() const {
  std::uint64_t count = 1;
  for (std::int64_t dim : shape) count *= static_cast<std::uint64_t>(dim < 0 ? 0 : dim);
  return count;
}

std::size_t ItemSize(std::string_view dtype) {
  static const std::pair<std::string_view, std::size_t> kSizes[] = {
      {"bool", 1},     {"int8", 1},      {"uint8", 1},       {"int16", 2},         {"uint16", 2},
      {"int32", 4},    {"uint32", 4},    {"int64", 8},       {"uint64", 8},        {"float16", 2},
      {"bfloat16", 2}, {"float32", 4},   {"float64", 8},     {"complex64", 8},     {"complex128", 16},
      {"float8_e4m3fn", 1}, {"float8_e4m3fnuz", 1}, {"float8_e5m2", 1}, {"float8_e5m2fnuz", 1},
      {"float8_e8m0fnu", 1},
  };
  for (const auto& [name, size] : kSizes) {
    if (name == dtype) return size;
  }
  return 0;
}

bool IsValidUtf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    auto lead = static_cast<unsigned char>(text[i]);
    int extra;
    std::uint32_t point;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if ((lead >> 5) == 0x6) {
      extra = 1, point = lead & 0x1Fu;
    } else if ((lead >> 4) == 0xE) {
      extra = 2, point = lead & 0x0Fu;
    } else if ((lead >> 3) == 0x1E) {
      extra = 3, point = lead & 0x07u;
    } else {
      return false;
    }
    if (text.size() - i <= static_cast<std::size_t>(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      point = (point << 6) | (next & 0x3Fu);
    }
    static const std::uint32_t kSmallest[] = {0, 0x80, 0x800, 0x10000};
    if (point < kSmallest[extra] || point > 0x10FFFF || (point >= 0xD800 && point <= 0xDFFF)) return false;
    i += static_cast<std::size_t>(extra) + 1;
  }
  return true;
}

// ------------------------------------------------------------------------ NotSupported defaults

namespace {
[[noreturn]] void Unsupported(const char* what) {
  throw NotSupported(std::string("this runtime does not implement ") + what);
}
}  // namespace

void Runtime::Verify(std::string_view, const std::string&) { Unsupported("verify"); }
Value Runtime::Decode(std::string_view, const std::string&, const std::string&) { Unsupported("decode"); }
NamedValues Runtime::ReadFields(std::string_view, const std::string&, const std::string&) {
  Unsupported("generic field access (read_fields)");
}
std::string Runtime::RoundTrip(std::string_view model, const std::string&) { return RoundTrip(model); }
std::string Runtime::RoundTrip(std::string_view) { Unsupported("explicit load and save (roundtrip)"); }
bool Runtime::SupportsHeldRuns() { return false; }
NamedValues Runtime::Run(StateId state, const NamedValues& feeds, const RunOptions& options) {
  if (options.hold) {  // the SDK sends a held run only when SupportsHeldRuns() said yes
    throw std::logic_error("SupportsHeldRuns() is true but Run(state, feeds, RunOptions) is not overridden");
  }
  return Run(state, feeds, options.cancelled);
}
StateId Runtime::OpenState(std::string_view, const NamedValues&, const std::string&) {
  Unsupported("persistent state (open_state)");
}
NamedValues Runtime::Run(StateId, const NamedValues&, bool) { Unsupported("persistent state (run)"); }
NamedValues Runtime::Values(StateId) { Unsupported("persistent state (values)"); }
void Runtime::Reset(StateId, const NamedValues&) { Unsupported("persistent state (reset)"); }
void Runtime::Close(StateId) { Unsupported("persistent state (close)"); }
std::map<std::string, std::int64_t> Runtime::Counters(StateId) { Unsupported("runtime counters"); }
ExportResult Runtime::Export(std::string_view model, const std::string& target, const std::string&) {
  return Export(model, target);
}
ExportResult Runtime::Export(std::string_view, const std::string&) { Unsupported("export"); }
std::string Runtime::Rewrite(std::string_view model, const std::string& rewrite_json, const std::string&) {
  return Rewrite(model, rewrite_json);
}
std::string Runtime::Rewrite(std::string_view, const std::string&) { Unsupported("rewrite"); }

}  // namespace onnx_light::testee
