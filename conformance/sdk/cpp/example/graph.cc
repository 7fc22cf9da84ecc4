#include "graph.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "affine.h"
#include "common.h"
#include "model.h"
#include "payload.h"
#include "registered.h"
#include "tensors.h"

namespace example {

using onnx_light::testee::Value;

namespace {

constexpr int kMaxCallDepth = 32;
constexpr std::int64_t kMaxLoopTrips = 1 << 16;

[[noreturn]] void ExecutionFailed(const std::string& where, const std::string& message) {
  Fail("EXECUTION_FAILED", where, message);
}

// Attributes of the node being run; inside a function, ref_attr_name reads the calling node's.
using Attributes = std::map<std::string, const onnx::AttributeProto*>;

class Interpreter {
 public:
  Interpreter(const Program& program, onnx_light::testee::HeldRun* hold) : program_(program), hold_(hold) {}

  // Runs `nodes` over `scope` (which gains every node output) and returns `scope`.
  void Nodes(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes, Scope& scope, const Attributes& outer,
             int depth) {
    if (depth > kMaxCallDepth) Fail("RESOURCE_LIMIT", "graph", "graphs and functions nest too deeply");
    for (int i = 0; i < nodes.size(); ++i) {
      const onnx::NodeProto& node = nodes.Get(i);
      const std::string where = "node " + node.op_type() + " (" + (node.name().empty() ? std::to_string(i) : node.name()) + ")";
      std::vector<const Value*> inputs;
      for (const std::string& name : node.input()) {
        if (name.empty()) {
          inputs.push_back(nullptr);
          continue;
        }
        auto found = scope.find(name);
        if (found == scope.end()) ExecutionFailed(where, "input " + name + " has no value");
        inputs.push_back(&found->second);
      }
      Attributes attributes;
      for (const onnx::AttributeProto& attribute : node.attribute()) {
        if (!attribute.ref_attr_name().empty()) {
          auto found = outer.find(attribute.ref_attr_name());
          if (found != outer.end()) attributes[attribute.name()] = found->second;
          continue;
        }
        attributes[attribute.name()] = &attribute;
      }
      std::vector<Value> outputs = Node(node, inputs, attributes, scope, depth, where);
      for (int k = 0; k < node.output_size() && k < static_cast<int>(outputs.size()); ++k) {
        if (!node.output(k).empty()) scope[node.output(k)] = std::move(outputs[k]);
      }
    }
  }

  // A subgraph (If branch, Loop body) sees the enclosing scope; returns its outputs in order.
  std::vector<Value> Subgraph(const onnx::GraphProto& graph, const Scope& enclosing, std::vector<Value> inputs,
                              int depth) {
    Scope scope = enclosing;
    for (const onnx::TensorProto& tensor : graph.initializer()) scope[tensor.name()] = TensorFromProto(tensor, "subgraph");
    for (int i = 0; i < graph.input_size() && i < static_cast<int>(inputs.size()); ++i) {
      scope[graph.input(i).name()] = std::move(inputs[i]);
    }
    Nodes(graph.node(), scope, {}, depth + 1);
    std::vector<Value> outputs;
    for (const onnx::ValueInfoProto& output : graph.output()) {
      auto found = scope.find(output.name());
      if (found == scope.end()) ExecutionFailed("subgraph " + graph.name(), "output " + output.name() + " has no value");
      outputs.push_back(found->second);
    }
    return outputs;
  }

 private:
  static const Value& In(const std::vector<const Value*>& inputs, std::size_t i, const std::string& where) {
    if (i >= inputs.size() || !inputs[i]) ExecutionFailed(where, "input " + std::to_string(i) + " is required");
    return *inputs[i];
  }

  static std::int64_t IntAttribute(const Attributes& attributes, const std::string& name, std::int64_t fallback) {
    auto found = attributes.find(name);
    return found == attributes.end() ? fallback : found->second->i();
  }

  std::vector<Value> Node(const onnx::NodeProto& node, const std::vector<const Value*>& inputs,
                          const Attributes& attributes, const Scope& scope, int depth, const std::string& where) {
    const std::string& domain = node.domain();
    const std::string& op = node.op_type();
    auto function = program_.functions.find({domain, op});
    if (function != program_.functions.end()) return Function(*function->second, inputs, attributes, depth, where);
    if (domain == "onnx_light.conformance" && op == "Hold") return {Hold(In(inputs, 0, where))};
    if (domain == "onnx_light") {
      if (op == "Decode") return {Decode(In(inputs, 0, where), where)};
      if (op == "GetField") return {GetField(In(inputs, 0, where), attributes, where)};
      if (op == "MakeStruct") return {MakeStruct(inputs, attributes, where)};
    }
    if (!domain.empty() && domain != "ai.onnx") Unsupported(where, "operator " + domain + "::" + op);
    if (op == "Identity") return {In(inputs, 0, where)};
    if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Equal") {
      return {Binary(op, In(inputs, 0, where), In(inputs, 1, where), where)};
    }
    if (op == "Relu") return {Relu(In(inputs, 0, where), where)};
    if (op == "Cast") return {Cast(In(inputs, 0, where), IntAttribute(attributes, "to", 0), where)};
    if (op == "Concat") return {Concat(inputs, IntAttribute(attributes, "axis", 0), where)};
    if (op == "Reshape") return {Reshape(In(inputs, 0, where), In(inputs, 1, where), IntAttribute(attributes, "allowzero", 0), where)};
    if (op == "ReduceSum") return {ReduceSum(inputs, attributes, where)};
    if (op == "Split") return Split(node, inputs, attributes, where);
    if (op == "Where") return {Where(In(inputs, 0, where), In(inputs, 1, where), In(inputs, 2, where), where)};
    if (op == "Constant") return {Constant(attributes, where)};
    if (op == "SequenceEmpty") return {Value::Sequence({})};
    if (op == "SequenceConstruct") {
      std::vector<Value> items;
      for (std::size_t i = 0; i < inputs.size(); ++i) items.push_back(In(inputs, i, where));
      return {Value::Sequence(std::move(items))};
    }
    if (op == "SequenceLength") {
      const Value& sequence = In(inputs, 0, where);
      if (sequence.kind != Value::Kind::kSequence) ExecutionFailed(where, "a sequence is required");
      return {MakeTensor("int64", {}, {static_cast<double>(sequence.items.size())})};
    }
    if (op == "SequenceAt") return {SequenceAt(In(inputs, 0, where), In(inputs, 1, where), where)};
    if (op == "If") return If(In(inputs, 0, where), attributes, scope, depth, where);
    if (op == "Loop") return Loop(inputs, attributes, scope, depth, where);
    Unsupported(where, "operator " + op);
  }

  // ---- control flow and functions -------------------------------------------------------------
  std::vector<Value> Function(const onnx::FunctionProto& function, const std::vector<const Value*>& inputs,
                              const Attributes& attributes, int depth, const std::string& where) {
    Scope scope;
    for (int i = 0; i < function.input_size(); ++i) {
      if (i < static_cast<int>(inputs.size()) && inputs[i]) scope[function.input(i)] = *inputs[i];
    }
    Attributes visible = attributes;
    for (const onnx::AttributeProto& fallback : function.attribute_proto()) visible.emplace(fallback.name(), &fallback);
    Nodes(function.node(), scope, visible, depth + 1);
    std::vector<Value> outputs;
    for (const std::string& name : function.output()) {
      auto found = scope.find(name);
      if (found == scope.end()) ExecutionFailed(where, "function output " + name + " has no value");
      outputs.push_back(found->second);
    }
    return outputs;
  }

  static bool Truth(const Value& condition, const std::string& where) {
    std::vector<double> values = ReadNumbers(condition, where);
    if (values.size() != 1) ExecutionFailed(where, "the condition holds one element");
    return values[0] != 0;
  }

  std::vector<Value> If(const Value& condition, const Attributes& attributes, const Scope& scope, int depth,
                        const std::string& where) {
    auto branch = attributes.find(Truth(condition, where) ? "then_branch" : "else_branch");
    if (branch == attributes.end() || !branch->second->has_g()) ExecutionFailed(where, "a branch is missing");
    return Subgraph(branch->second->g(), scope, {}, depth);
  }

  std::vector<Value> Loop(const std::vector<const Value*>& inputs, const Attributes& attributes, const Scope& scope,
                          int depth, const std::string& where) {
    auto body = attributes.find("body");
    if (body == attributes.end() || !body->second->has_g()) ExecutionFailed(where, "the body is missing");
    const onnx::GraphProto& graph = body->second->g();
    std::int64_t trips = kMaxLoopTrips;
    if (inputs.size() > 0 && inputs[0]) {
      std::vector<double> m = ReadNumbers(*inputs[0], where);
      if (m.size() != 1) ExecutionFailed(where, "the trip count holds one element");
      trips = ToInt64(m[0]);
      if (trips > kMaxLoopTrips) Fail("RESOURCE_LIMIT", where, "more loop trips than this executor runs");
    }
    bool go = inputs.size() > 1 && inputs[1] ? Truth(*inputs[1], where) : true;
    std::vector<Value> carried;
    for (std::size_t i = 2; i < inputs.size(); ++i) carried.push_back(In(inputs, i, where));
    const std::size_t scans = graph.output_size() > static_cast<int>(carried.size()) + 1
                                  ? graph.output_size() - carried.size() - 1 : 0;
    std::vector<std::vector<Value>> scanned(scans);
    for (std::int64_t trip = 0; trip < trips && go; ++trip) {
      std::vector<Value> body_inputs = {MakeTensor("int64", {}, {static_cast<double>(trip)}),
                                        MakeTensor("bool", {}, {1.0})};
      body_inputs.insert(body_inputs.end(), carried.begin(), carried.end());
      std::vector<Value> outputs = Subgraph(graph, scope, std::move(body_inputs), depth);
      if (outputs.size() < carried.size() + 1) ExecutionFailed(where, "the body has too few outputs");
      go = Truth(outputs[0], where);
      for (std::size_t i = 0; i < carried.size(); ++i) carried[i] = outputs[i + 1];
      for (std::size_t i = 0; i < scans; ++i) scanned[i].push_back(outputs[1 + carried.size() + i]);
    }
    std::vector<Value> results = carried;
    for (auto& values : scanned) results.push_back(Stack(values, where));
    return results;
  }

  static Value Stack(const std::vector<Value>& values, const std::string& where) {
    if (values.empty()) ExecutionFailed(where, "a scan output of no iterations has no element type");
    std::vector<double> all;
    for (const Value& value : values) {
      if (value.shape != values[0].shape || value.dtype != values[0].dtype) ExecutionFailed(where, "scan outputs differ in shape");
      std::vector<double> part = ReadNumbers(value, where);
      all.insert(all.end(), part.begin(), part.end());
    }
    std::vector<std::int64_t> shape = {static_cast<std::int64_t>(values.size())};
    shape.insert(shape.end(), values[0].shape.begin(), values[0].shape.end());
    return MakeTensor(values[0].dtype, shape, all);
  }

  // ---- roles ------------------------------------------------------------------------------------
  Value Hold(const Value& value) {
    if (hold_ && hold_->Park()) Fail("STATE_CANCELLED", "Hold", "the run was cancelled while it was active");
    return value;
  }

  // An encoded value's logical tensor: the layout is verified against the model's catalogue first.
  Value Decode(const Value& encoded, const std::string& where) {
    if (encoded.kind != Value::Kind::kEncoded) Fail("CONSUMER_MISSING", where, "Decode takes an encoded value");
    auto value = std::make_shared<onnx::EncodedValueProto>();
    if (!value->ParseFromString(encoded.header)) ExecutionFailed(where, "the encoded header does not parse");
    value->clear_external_data();
    value->clear_data_location();
    value->set_raw_data(encoded.data, encoded.size);  // the kernel's own read of the payload
    EncodedInfo info = VerifyEncodedValue(*program_.catalogue, *value, "", where);
    Payload payload{reinterpret_cast<const std::uint8_t*>(value->raw_data().data()), value->raw_data().size(), value};
    if (info.affine) return DecodeAffine(*value, *info.affine, payload, where);
    const onnx::StructTypeProto& layout = value->struct_type();
    if (layout.has_type_ref() && !program_.catalogue->Lookup(layout.type_ref(), where).has_decoder()) {
      try {
        return DecodeRegistered(*program_.catalogue, *value, payload, info.record_bytes, where);
      } catch (const onnx_light::testee::NotSupported& missing) {
        // No registered consumer and no declared decoder: in a running graph that is the verdict.
        Fail("CONSUMER_MISSING", where, missing.what());
      }
    }
    return DecodeRegistered(*program_.catalogue, *value, payload, info.record_bytes, where);
  }

  // The catalogue declaration of a struct type ID, when it is a structure.
  const onnx::StructTypeProto::Structure* Structure(std::uint64_t type_id, const std::string& where) const {
    const onnx::StructTypeProto& declaration = program_.catalogue->Lookup(type_id, where);
    return declaration.has_structure() ? &declaration.structure() : nullptr;
  }

  // A field of the value, or a constant field of its declared type (declared once, in the catalogue).
  Value GetField(const Value& value, const Attributes& attributes, const std::string& where) const {
    auto name = attributes.find("field");
    if (name == attributes.end()) ExecutionFailed(where, "the field attribute is missing");
    if (value.kind != Value::Kind::kStruct) ExecutionFailed(where, "GetField takes a struct value");
    for (const auto& field : value.fields) {
      if (field.first == name->second->s()) return field.second;
    }
    if (value.type_id) {
      if (const auto* structure = Structure(*value.type_id, where)) {
        for (const auto& field : structure->field()) {
          if (field.name() == name->second->s() && field.has_constant()) return TensorFromProto(field.constant(), where);
        }
      }
    }
    ExecutionFailed(where, "no field " + name->second->s());
  }

  // Field names come from the `fields` attribute, else from the declaration of `type_id` (its
  // non-constant fields in order).
  Value MakeStruct(const std::vector<const Value*>& inputs, const Attributes& attributes, const std::string& where) const {
    std::optional<std::uint64_t> type_id;
    auto id = attributes.find("type_id");
    if (id != attributes.end()) type_id = static_cast<std::uint64_t>(id->second->i());
    std::vector<std::string> names;
    auto given = attributes.find("fields");
    if (given != attributes.end()) {
      names.assign(given->second->strings().begin(), given->second->strings().end());
    } else if (type_id) {
      if (const auto* structure = Structure(*type_id, where)) {
        for (const auto& field : structure->field()) {
          if (!field.has_constant()) names.push_back(field.name());
        }
      }
    }
    if (names.size() != inputs.size()) ExecutionFailed(where, "one field name per input is required");
    std::vector<std::pair<std::string, Value>> fields;
    for (std::size_t i = 0; i < inputs.size(); ++i) fields.emplace_back(names[i], In(inputs, i, where));
    return Value::Struct(std::move(fields), type_id);
  }

  // ---- tensor kernels -----------------------------------------------------------------------------
  static bool IsText(const Value& value) {
    return value.kind == Value::Kind::kTensor && (value.dtype == "str" || value.dtype == "bytes");
  }

  // Equal of two string tensors, elementwise under broadcasting.
  static Value TextEqual(const Value& a, const Value& b, const std::string& where) {
    if (!IsText(a) || !IsText(b)) ExecutionFailed(where, "both inputs are string tensors");
    const std::vector<std::int64_t> shape = Broadcast(a.shape, b.shape, where);
    std::vector<double> out(ElementCount(shape, where));
    for (std::uint64_t i = 0; i < out.size(); ++i) {
      out[i] = a.strings.at(BroadcastIndex(i, shape, a.shape)) == b.strings.at(BroadcastIndex(i, shape, b.shape));
    }
    return MakeTensor("bool", shape, out);
  }

  static Value Binary(const std::string& op, const Value& a, const Value& b, const std::string& where) {
    if (op == "Equal" && (IsText(a) || IsText(b))) return TextEqual(a, b, where);
    if (a.kind != Value::Kind::kTensor || b.kind != Value::Kind::kTensor || a.dtype != b.dtype) {
      ExecutionFailed(where, "both inputs are tensors of one element type");
    }
    const std::vector<double> x = ReadNumbers(a, where), y = ReadNumbers(b, where);
    const std::vector<std::int64_t> shape = Broadcast(a.shape, b.shape, where);
    const std::uint64_t count = ElementCount(shape, where);
    const bool integral = a.dtype != "float32" && a.dtype != "float64" && a.dtype != "float16";
    std::vector<double> out(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      const double p = x[BroadcastIndex(i, shape, a.shape)], q = y[BroadcastIndex(i, shape, b.shape)];
      if (op == "Add") out[i] = p + q;
      else if (op == "Sub") out[i] = p - q;
      else if (op == "Mul") out[i] = p * q;
      else if (op == "Equal") out[i] = p == q;
      else if (integral && q == 0) ExecutionFailed(where, "integer division by zero");
      else out[i] = integral ? std::trunc(p / q) : p / q;
      if (a.dtype == "float32" && op != "Equal") out[i] = static_cast<float>(out[i]);  // rounded as float math
    }
    return MakeTensor(op == "Equal" ? "bool" : a.dtype, shape, out);
  }

  static Value Relu(const Value& a, const std::string& where) {
    std::vector<double> x = ReadNumbers(a, where);
    for (double& v : x) v = v > 0 ? v : 0;
    return MakeTensor(a.dtype, a.shape, x);
  }

  static Value Cast(const Value& a, std::int64_t to, const std::string& where) {
    const std::string dtype = DtypeName(static_cast<int>(to));
    if (dtype.empty() || dtype == "bfloat16") Unsupported(where, "Cast to element type " + std::to_string(to));
    std::vector<double> x = ReadNumbers(a, where);
    if (dtype == "float32") {
      for (double& v : x) v = static_cast<float>(v);
    }
    return MakeTensor(dtype, a.shape, x);
  }

  static std::size_t Axis(std::int64_t axis, std::size_t rank, const std::string& where) {
    const auto r = static_cast<std::int64_t>(rank);
    if (axis < -r || axis >= r) ExecutionFailed(where, "axis " + std::to_string(axis) + " is out of range");
    return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
  }

  static Value Concat(const std::vector<const Value*>& inputs, std::int64_t axis_attribute, const std::string& where) {
    const Value& first = In(inputs, 0, where);
    if (first.kind != Value::Kind::kTensor) ExecutionFailed(where, "Concat takes tensors");
    const std::size_t axis = Axis(axis_attribute, first.shape.size(), where);
    std::vector<std::int64_t> shape = first.shape;
    shape[axis] = 0;
    std::vector<std::vector<double>> parts;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const Value& part = In(inputs, i, where);
      if (part.kind != Value::Kind::kTensor || part.dtype != first.dtype || part.shape.size() != first.shape.size()) {
        ExecutionFailed(where, "inputs differ in element type or rank");
      }
      for (std::size_t d = 0; d < shape.size(); ++d) {
        if (d != axis && part.shape[d] != first.shape[d]) ExecutionFailed(where, "inputs differ off the axis");
      }
      if (__builtin_add_overflow(shape[axis], part.shape[axis], &shape[axis])) {
        Fail("RESOURCE_LIMIT", where, "the concatenated dimension overflows");
      }
      parts.push_back(ReadNumbers(part, where));
    }
    std::uint64_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= static_cast<std::uint64_t>(shape[d]);
    for (std::size_t d = axis + 1; d < shape.size(); ++d) inner *= static_cast<std::uint64_t>(shape[d]);
    std::vector<double> out;
    out.reserve(ElementCount(shape, where));
    for (std::uint64_t o = 0; o < outer; ++o) {
      for (std::size_t i = 0; i < parts.size(); ++i) {
        const std::uint64_t chunk = static_cast<std::uint64_t>(In(inputs, i, where).shape[axis]) * inner;
        out.insert(out.end(), parts[i].begin() + static_cast<std::ptrdiff_t>(o * chunk),
                   parts[i].begin() + static_cast<std::ptrdiff_t>((o + 1) * chunk));
      }
    }
    return MakeTensor(first.dtype, shape, out);
  }

  static Value Reshape(const Value& data, const Value& shape_tensor, std::int64_t allow_zero, const std::string& where) {
    std::vector<double> x = ReadNumbers(data, where);
    std::vector<std::int64_t> shape = ReadIndices(shape_tensor, where);
    std::int64_t known = 1;
    int unknown = -1;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0 && !allow_zero) {
        if (d >= data.shape.size()) ExecutionFailed(where, "a zero dimension copies no input dimension");
        shape[d] = data.shape[d];
      }
      if (shape[d] == -1) {
        if (unknown >= 0) ExecutionFailed(where, "two dimensions are -1");
        unknown = static_cast<int>(d);
        continue;
      }
      if (shape[d] < 0) ExecutionFailed(where, "a negative dimension");
      if (__builtin_mul_overflow(known, shape[d], &known)) Fail("RESOURCE_LIMIT", where, "the new shape overflows");
    }
    if (unknown >= 0) {
      if (known == 0 || x.size() % static_cast<std::uint64_t>(known)) ExecutionFailed(where, "the -1 dimension does not divide");
      shape[unknown] = static_cast<std::int64_t>(x.size() / static_cast<std::uint64_t>(known));
    }
    if (ElementCount(shape, where) != x.size()) ExecutionFailed(where, "the new shape holds another element count");
    return MakeTensor(data.dtype, shape, x);
  }

  static Value ReduceSum(const std::vector<const Value*>& inputs, const Attributes& attributes, const std::string& where) {
    const Value& data = In(inputs, 0, where);
    std::vector<double> x = ReadNumbers(data, where);
    const std::size_t rank = data.shape.size();
    std::vector<bool> reduced(rank, false);
    std::vector<std::int64_t> axes;
    if (inputs.size() > 1 && inputs[1]) axes = ReadIndices(*inputs[1], where);
    if (axes.empty()) {
      if (IntAttribute(attributes, "noop_with_empty_axes", 0)) return data;
      reduced.assign(rank, true);
    }
    for (std::int64_t axis : axes) reduced[Axis(axis, rank, where)] = true;
    const bool keep = IntAttribute(attributes, "keepdims", 1) != 0;
    std::vector<std::int64_t> kept, shape;
    for (std::size_t d = 0; d < rank; ++d) {
      kept.push_back(reduced[d] ? 1 : data.shape[d]);
      if (!reduced[d] || keep) shape.push_back(kept.back());
    }
    std::vector<double> out(ElementCount(kept, where), 0.0);
    for (std::uint64_t i = 0; i < x.size(); ++i) {
      std::uint64_t rest = i, index = 0, stride = 1;
      for (std::size_t d = rank; d-- > 0;) {
        const auto coordinate = rest % static_cast<std::uint64_t>(data.shape[d]);
        rest /= static_cast<std::uint64_t>(data.shape[d]);
        if (!reduced[d]) index += coordinate * stride;
        stride *= static_cast<std::uint64_t>(kept[d]);
      }
      out[index] += x[i];
    }
    if (data.dtype == "float32") {
      for (double& v : out) v = static_cast<float>(v);
    }
    return MakeTensor(data.dtype, shape, out);
  }

  static std::vector<Value> Split(const onnx::NodeProto& node, const std::vector<const Value*>& inputs,
                                  const Attributes& attributes, const std::string& where) {
    const Value& data = In(inputs, 0, where);
    std::vector<double> x = ReadNumbers(data, where);
    const std::size_t axis = Axis(IntAttribute(attributes, "axis", 0), data.shape.size(), where);
    const std::int64_t length = data.shape[axis];
    std::vector<std::int64_t> sizes;
    if (inputs.size() > 1 && inputs[1]) {
      sizes = ReadIndices(*inputs[1], where);
    } else {
      const std::int64_t parts = IntAttribute(attributes, "num_outputs", node.output_size());
      if (parts <= 0 || parts != node.output_size()) ExecutionFailed(where, "num_outputs is not the output count");
      const std::int64_t each = (length + parts - 1) / parts;
      for (std::int64_t p = 0, left = length; p < parts; ++p, left -= each) sizes.push_back(std::max<std::int64_t>(0, std::min(each, left)));
    }
    std::int64_t total = 0;
    for (std::int64_t size : sizes) {
      if (size < 0 || __builtin_add_overflow(total, size, &total)) ExecutionFailed(where, "split sizes do not fit");
    }
    if (total != length || static_cast<int>(sizes.size()) != node.output_size()) ExecutionFailed(where, "split sizes do not fit");
    std::uint64_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < axis; ++d) outer *= static_cast<std::uint64_t>(data.shape[d]);
    for (std::size_t d = axis + 1; d < data.shape.size(); ++d) inner *= static_cast<std::uint64_t>(data.shape[d]);
    std::vector<Value> outputs;
    std::int64_t start = 0;
    for (std::int64_t size : sizes) {
      std::vector<double> part;
      for (std::uint64_t o = 0; o < outer; ++o) {
        const std::uint64_t base = (o * static_cast<std::uint64_t>(length) + static_cast<std::uint64_t>(start)) * inner;
        part.insert(part.end(), x.begin() + static_cast<std::ptrdiff_t>(base),
                    x.begin() + static_cast<std::ptrdiff_t>(base + static_cast<std::uint64_t>(size) * inner));
      }
      std::vector<std::int64_t> shape = data.shape;
      shape[axis] = size;
      outputs.push_back(MakeTensor(data.dtype, shape, part));
      start += size;
    }
    return outputs;
  }

  static Value Where(const Value& condition, const Value& a, const Value& b, const std::string& where) {
    if (a.kind != Value::Kind::kTensor || b.kind != Value::Kind::kTensor || IsText(a) != IsText(b) ||
        (!IsText(a) && a.dtype != b.dtype)) {
      ExecutionFailed(where, "both branches are tensors of one element type");
    }
    const std::vector<double> c = ReadNumbers(condition, where);
    const std::vector<std::int64_t> shape = Broadcast(Broadcast(condition.shape, a.shape, where), b.shape, where);
    if (IsText(a)) {
      Value text;
      text.kind = Value::Kind::kTensor;
      text.dtype = a.dtype == "bytes" || b.dtype == "bytes" ? "bytes" : "str";
      text.shape = shape;
      for (std::uint64_t i = 0; i < ElementCount(shape, where); ++i) {
        text.strings.push_back(c[BroadcastIndex(i, shape, condition.shape)] != 0
                                   ? a.strings.at(BroadcastIndex(i, shape, a.shape))
                                   : b.strings.at(BroadcastIndex(i, shape, b.shape)));
      }
      return text;
    }
    const std::vector<double> x = ReadNumbers(a, where), y = ReadNumbers(b, where);
    std::vector<double> out(ElementCount(shape, where));
    for (std::uint64_t i = 0; i < out.size(); ++i) {
      out[i] = c[BroadcastIndex(i, shape, condition.shape)] != 0 ? x[BroadcastIndex(i, shape, a.shape)]
                                                                 : y[BroadcastIndex(i, shape, b.shape)];
    }
    return MakeTensor(a.dtype, shape, out);
  }

  static Value Constant(const Attributes& attributes, const std::string& where) {
    auto value = attributes.find("value");
    if (value == attributes.end() || !value->second->has_t()) Unsupported(where, "Constant without a tensor value");
    return TensorFromProto(value->second->t(), where);
  }

  static Value SequenceAt(const Value& sequence, const Value& position, const std::string& where) {
    if (sequence.kind != Value::Kind::kSequence) ExecutionFailed(where, "a sequence is required");
    std::vector<std::int64_t> at = ReadIndices(position, where);
    const auto size = static_cast<std::int64_t>(sequence.items.size());
    if (at.size() != 1 || at[0] < -size || at[0] >= size) ExecutionFailed(where, "the position is out of range");
    return sequence.items[static_cast<std::size_t>(at[0] < 0 ? at[0] + size : at[0])];
  }

  const Program& program_;
  onnx_light::testee::HeldRun* hold_;
};

}  // namespace

Scope ProgramConstants(const std::shared_ptr<const onnx::ModelProto>& model, const std::string& base_dir) {
  Scope constants;
  const onnx::GraphProto& graph = model->graph();
  for (int i = 0; i < graph.initializer_size(); ++i) {
    constants[graph.initializer(i).name()] =
        TensorFromProto(graph.initializer(i), "model.graph.initializer[" + std::to_string(i) + "]");
  }
  for (int i = 0; i < graph.encoded_initializer_size(); ++i) {
    const onnx::EncodedValueProto& value = graph.encoded_initializer(i);
    const std::string path = "model.graph.encoded_initializer[" + std::to_string(i) + "]";
    const Payload payload = OpenPayload(value, PayloadExtent(value, path), base_dir, path, model);
    onnx::EncodedValueProto header = value;
    header.clear_raw_data();
    Value encoded;
    encoded.kind = Value::Kind::kEncoded;
    encoded.header = header.SerializeAsString();
    encoded.data = payload.data;
    encoded.size = payload.size;
    encoded.owner = payload.owner;
    encoded.read_only = true;
    constants[value.name()] = std::move(encoded);
  }
  return constants;
}

Scope Execute(const Program& program, const Scope& inputs, onnx_light::testee::HeldRun* hold) {
  Scope scope = program.constants;
  for (const auto& [name, value] : inputs) scope[name] = value;
  Interpreter interpreter(program, hold);
  interpreter.Nodes(program.model->graph().node(), scope, {}, 0);
  Scope outputs;
  for (const onnx::ValueInfoProto& output : program.model->graph().output()) {
    auto found = scope.find(output.name());
    if (found == scope.end()) ExecutionFailed("model.graph.output", output.name() + " has no value");
    outputs[output.name()] = found->second;
  }
  return outputs;
}

}  // namespace example
