#include "model.h"

#include <cstdint>
#include <map>

#include "common.h"

namespace example {
namespace {

class Verifier {
 public:
  Verifier(const Catalogue& catalogue, const std::string& base_dir) : catalogue_(catalogue), base_dir_(base_dir) {}

  void Graph(const onnx::GraphProto& graph, const std::string& path, std::vector<EncodedInfo>* values) {
    ValueInfos(graph.input(), path + ".input");
    ValueInfos(graph.output(), path + ".output");
    ValueInfos(graph.value_info(), path + ".value_info");
    InitializerNames(graph, path);
    for (int i = 0; i < graph.encoded_initializer_size(); ++i) {
      EncodedInfo info = Encoded(graph.encoded_initializer(i), path + ".encoded_initializer[" + std::to_string(i) + "]");
      if (values) values->push_back(std::move(info));
    }
    for (int i = 0; i < graph.node_size(); ++i) Subgraphs(graph.node(i), path + ".node[" + std::to_string(i) + "]");
  }

  void Subgraphs(const onnx::NodeProto& node, const std::string& path) {
    for (int i = 0; i < node.attribute_size(); ++i) {
      const onnx::AttributeProto& attribute = node.attribute(i);
      const std::string attribute_path = path + ".attribute[" + std::to_string(i) + "]";
      if (attribute.has_g()) Graph(attribute.g(), attribute_path + ".g", nullptr);
      for (int k = 0; k < attribute.graphs_size(); ++k) {
        Graph(attribute.graphs(k), attribute_path + ".graphs[" + std::to_string(k) + "]", nullptr);
      }
    }
  }

 private:
  // Graph inputs, outputs and value_info of struct type follow the declaration rules.
  void ValueInfos(const google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& infos, const std::string& path) {
    for (int i = 0; i < infos.size(); ++i) {
      if (infos.Get(i).has_type() && ContainsStruct(infos.Get(i).type())) {
        catalogue_.CheckType(infos.Get(i).type(), path + "[" + std::to_string(i) + "].type", 0);
      }
    }
  }

  // Names are unique across dense, sparse and encoded initializers; encoded ones are named.
  static void InitializerNames(const onnx::GraphProto& graph, const std::string& path) {
    std::map<std::string, std::string> seen;
    auto add = [&](const std::string& name, const std::string& item_path, bool encoded) {
      if (encoded && name.empty()) Fail("INITIALIZER_NAME_EMPTY", item_path + ".name", "encoded initializers need a name");
      auto [found, inserted] = seen.emplace(name, item_path);
      if (!inserted) Fail("INITIALIZER_NAME_DUPLICATE", item_path + ".name", "the name is already used by " + found->second);
    };
    for (int i = 0; i < graph.initializer_size(); ++i) {
      add(graph.initializer(i).name(), path + ".initializer[" + std::to_string(i) + "]", false);
    }
    for (int i = 0; i < graph.sparse_initializer_size(); ++i) {
      add(graph.sparse_initializer(i).values().name(), path + ".sparse_initializer[" + std::to_string(i) + "]", false);
    }
    for (int i = 0; i < graph.encoded_initializer_size(); ++i) {
      add(graph.encoded_initializer(i).name(), path + ".encoded_initializer[" + std::to_string(i) + "]", true);
    }
  }

  // One encoded value: layout, payload extent and (with a base_dir) its backing file.
 public:
  EncodedInfo Encoded(const onnx::EncodedValueProto& value, const std::string& path) {
    EncodedInfo info;
    info.value = &value;
    info.path = path;
    if (value.layout_case() == onnx::EncodedValueProto::LAYOUT_NOT_SET) {
      Fail("LAYOUT_MISSING", path, "an encoded value selects the affine or the struct layout");
    }
    info.extent = PayloadExtent(value, path);
    if (value.has_affine()) {
      info.affine = VerifyAffine(value, info.extent, path);
    } else {
      info.record_bytes = StructLayout(value, info.extent, path);
    }
    CheckFile(info.extent, base_dir_, path);
    return info;
  }

 private:

  // A struct layout is a concrete, byte-encodable type of positive whole-byte size; the payload holds
  // whole records. Returns the record size.
  std::uint64_t StructLayout(const onnx::EncodedValueProto& value, const Extent& extent, const std::string& path) {
    const std::string layout_path = path + ".struct_type";
    const onnx::StructTypeProto& layout = value.struct_type();
    if (layout.kind_case() == onnx::StructTypeProto::KIND_NOT_SET) {
      Fail("KINDLESS_MISPLACED", layout_path, "a kind-less StructTypeProto is never a payload layout");
    }
    catalogue_.CheckStruct(layout, layout_path, Role::kLayout, 0);
    BitSize size = catalogue_.StructBits(layout, layout_path, 0);
    if (!size.fixed) Fail("NOT_FIXED_SIZE", size.path, "not byte-encodable: " + size.reason);
    if (size.bits == 0) Fail("ROOT_SIZE_ZERO", layout_path, "an encoding root needs a positive size");
    if (size.bits % 8) Fail("ROOT_SIZE_NOT_BYTES", layout_path, "the root size is not a whole number of bytes");
    const std::uint64_t record_bytes = size.bits / 8;
    if (extent.length % record_bytes) {
      Fail("PAYLOAD_PARTIAL_RECORD", path, std::to_string(extent.length) + " payload bytes are not a whole number of " +
                                               std::to_string(record_bytes) + "-byte records");
    }
    if (value.has_logical_type()) catalogue_.CheckType(value.logical_type(), path + ".logical_type", 0);
    return record_bytes;
  }

  const Catalogue& catalogue_;
  const std::string& base_dir_;
};

}  // namespace

EncodedInfo VerifyEncodedValue(const Catalogue& catalogue, const onnx::EncodedValueProto& value,
                               const std::string& base_dir, const std::string& path) {
  Verifier verifier(catalogue, base_dir);
  return verifier.Encoded(value, path);
}

VerifiedModel VerifyModel(std::string_view bytes, const std::string& base_dir) {
  auto model = std::make_shared<onnx::ModelProto>();
  if (bytes.size() > static_cast<std::size_t>(INT32_MAX) ||
      !model->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    Fail("MODEL_PARSE_ERROR", "model", "not a parseable ModelProto");
  }
  VerifiedModel verified;
  verified.model = model;
  verified.catalogue = std::make_unique<Catalogue>(model->struct_types());
  Verifier verifier(*verified.catalogue, base_dir);
  verifier.Graph(model->graph(), "model.graph", &verified.values);
  for (int i = 0; i < model->functions_size(); ++i) {
    const onnx::FunctionProto& function = model->functions(i);
    for (int k = 0; k < function.node_size(); ++k) {
      verifier.Subgraphs(function.node(k), "model.functions[" + std::to_string(i) + "].node[" + std::to_string(k) + "]");
    }
  }
  return verified;
}

}  // namespace example
