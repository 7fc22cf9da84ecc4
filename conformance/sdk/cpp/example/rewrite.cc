#include "rewrite.h"

#include <map>
#include <set>

#include "common.h"
#include "onnx-light.pb.h"

namespace example {
namespace {

// A flat JSON object of string members (the rewrite request's shape); anything else is refused.
std::map<std::string, std::string> ParseFlatObject(const std::string& text) {
  std::map<std::string, std::string> members;
  std::size_t at = 0;
  auto skip = [&] { while (at < text.size() && (text[at] == ' ' || text[at] == '\n' || text[at] == '\t' || text[at] == '\r')) ++at; };
  auto expect = [&](char c) {
    skip();
    if (at >= text.size() || text[at] != c) Unsupported("rewrite", "a flat JSON object of strings is expected");
    ++at;
  };
  auto string = [&] {
    expect('"');
    std::string out;
    while (at < text.size() && text[at] != '"') {
      char c = text[at++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at >= text.size()) break;
      const char e = text[at++];
      if (e == 'u') {
        if (at + 4 > text.size()) break;
        unsigned code = 0;
        for (int k = 0; k < 4; ++k) {
          const char h = text[at++];
          const int digit = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (digit < 0) Unsupported("rewrite", "a malformed \\u escape");
          code = code * 16 + static_cast<unsigned>(digit);
        }
        if (code < 0x80) out += static_cast<char>(code);
        else if (code < 0x800) out += static_cast<char>(0xc0 | (code >> 6)), out += static_cast<char>(0x80 | (code & 0x3f));
        else out += static_cast<char>(0xe0 | (code >> 12)), out += static_cast<char>(0x80 | ((code >> 6) & 0x3f)),
             out += static_cast<char>(0x80 | (code & 0x3f));
        continue;
      }
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e;
    }
    expect('"');
    return out;
  };
  expect('{');
  skip();
  if (at < text.size() && text[at] == '}') return members;
  while (true) {
    std::string key = string();
    expect(':');
    members[key] = string();
    skip();
    if (at < text.size() && text[at] == ',') {
      ++at;
      continue;
    }
    expect('}');
    return members;
  }
}

void RenameIn(onnx::GraphProto& graph, const std::string& from, const std::string& to);

void RenameNodes(google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes, const std::string& from, const std::string& to) {
  for (onnx::NodeProto& node : nodes) {
    for (std::string& input : *node.mutable_input()) if (input == from) input = to;
    for (std::string& output : *node.mutable_output()) if (output == from) output = to;
    for (onnx::AttributeProto& attribute : *node.mutable_attribute()) {
      if (attribute.has_g()) RenameIn(*attribute.mutable_g(), from, to);
      for (onnx::GraphProto& graph : *attribute.mutable_graphs()) RenameIn(graph, from, to);
    }
  }
}

// Subgraphs see outer names: a rename reaches their uses too (a subgraph's own names are distinct in SSA).
void RenameIn(onnx::GraphProto& graph, const std::string& from, const std::string& to) {
  RenameNodes(*graph.mutable_node(), from, to);
  for (auto* infos : {graph.mutable_input(), graph.mutable_output(), graph.mutable_value_info()}) {
    for (onnx::ValueInfoProto& info : *infos) if (info.name() == from) info.set_name(to);
  }
  for (onnx::TensorProto& tensor : *graph.mutable_initializer()) if (tensor.name() == from) tensor.set_name(to);
  for (onnx::EncodedValueProto& value : *graph.mutable_encoded_initializer()) if (value.name() == from) value.set_name(to);
  for (onnx::PersistentBindingProto& binding : *graph.mutable_persistent_bindings()) {
    if (binding.input_name() == from) binding.set_input_name(to);
    if (binding.output_name() == from) binding.set_output_name(to);
  }
}

std::set<std::string> RootNames(const onnx::GraphProto& graph) {
  std::set<std::string> names;
  for (const auto& info : graph.input()) names.insert(info.name());
  for (const auto& info : graph.output()) names.insert(info.name());
  for (const auto& tensor : graph.initializer()) names.insert(tensor.name());
  for (const auto& value : graph.encoded_initializer()) names.insert(value.name());
  for (const auto& node : graph.node()) {
    for (const auto& name : node.output()) names.insert(name);
  }
  return names;
}

}  // namespace

std::string RewriteModel(std::string_view bytes, const std::string& rewrite_json) {
  std::map<std::string, std::string> rewrite = ParseFlatObject(rewrite_json);
  if (rewrite["kind"] != "rename") Unsupported("rewrite", "rewrite kind " + rewrite["kind"]);
  onnx::ModelProto model;
  if (bytes.size() > static_cast<std::size_t>(INT32_MAX) || !model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    Fail("MODEL_PARSE_ERROR", "model", "not a parseable ModelProto");
  }
  const std::string& from = rewrite["old"];
  const std::string& to = rewrite["new"];
  const std::set<std::string> names = RootNames(model.graph());
  if (!names.count(from)) Fail("REWRITE_NAME_CONFLICT", "rewrite", "no value named " + from);
  if (from != to && names.count(to)) Fail("REWRITE_NAME_CONFLICT", "rewrite", to + " already names a value");
  RenameIn(*model.mutable_graph(), from, to);
  std::string out;
  if (!model.SerializeToString(&out)) throw std::runtime_error("the model could not be serialized");
  return out;
}

}  // namespace example
