"""The onnx-light extended ONNX schema, derived at import time from the onnx package's own descriptor.

The onnx package ships a compiled ``onnx-ml.proto`` descriptor. We copy it, add the local extension
messages and the field-1000/1001 branches exactly as the contract freezes them, and build message
classes in a private descriptor pool. This keeps ONNX itself untyped by us, needs no protoc at install
time, and keeps every ONNX message name (``onnx.ModelProto`` ...) so text format and wire bytes are the
same as ONNX's wherever the extensions are absent.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import DecodeError, Message
from onnx import onnx_ml_pb2

PROTO_FILE_NAME = "onnx_light/onnx-light.proto"
PACKAGE = "onnx"

_F = descriptor_pb2.FieldDescriptorProto
_OPT = _F.LABEL_OPTIONAL
_REP = _F.LABEL_REPEATED


def _field(name: str, number: int, ftype: int, label: int = _OPT, type_name: str = "",
           oneof_index: int | None = None) -> descriptor_pb2.FieldDescriptorProto:
    field = _F(name=name, number=number, type=ftype, label=label)
    if type_name:
        field.type_name = type_name
    if oneof_index is not None:
        field.oneof_index = oneof_index
    return field


def _message(name: str, fields: list, nested: list | None = None,
             oneofs: list[str] | None = None) -> descriptor_pb2.DescriptorProto:
    msg = descriptor_pb2.DescriptorProto(name=name)
    msg.field.extend(fields)
    msg.nested_type.extend(nested or [])
    for oneof in oneofs or []:
        msg.oneof_decl.add(name=oneof)
    return msg


def _extension_messages() -> list[descriptor_pb2.DescriptorProto]:
    """The local extension messages with the field numbers frozen by the contract."""
    T = _F
    affine = _message("AffineLayoutProto", [
        _field("storage_type", 1, T.TYPE_ENUM, type_name=".onnx.TensorProto.DataType"),
        _field("scale", 2, T.TYPE_MESSAGE, type_name=".onnx.TensorProto"),
        _field("zero_point", 3, T.TYPE_MESSAGE, type_name=".onnx.TensorProto"),
        _field("axis", 4, T.TYPE_INT64),
        _field("block_size", 5, T.TYPE_UINT64),
    ])
    encoded = _message("EncodedValueProto", [
        _field("affine", 1, T.TYPE_MESSAGE, type_name=".onnx.AffineLayoutProto", oneof_index=0),
        _field("struct_type", 2, T.TYPE_MESSAGE, type_name=".onnx.StructTypeProto", oneof_index=0),
        _field("logical_type", 3, T.TYPE_MESSAGE, type_name=".onnx.TypeProto"),
        _field("raw_data", 4, T.TYPE_BYTES),
        _field("external_data", 5, T.TYPE_MESSAGE, _REP, ".onnx.StringStringEntryProto"),
        _field("data_location", 6, T.TYPE_ENUM, type_name=".onnx.TensorProto.DataLocation"),
        _field("name", 7, T.TYPE_STRING),
        _field("doc_string", 8, T.TYPE_STRING),
    ], oneofs=["layout"])
    struct_field = _message("Field", [
        _field("name", 1, T.TYPE_STRING),
        _field("type", 2, T.TYPE_MESSAGE, type_name=".onnx.TypeProto", oneof_index=0),
        _field("constant", 4, T.TYPE_MESSAGE, type_name=".onnx.TensorProto", oneof_index=0),
        _field("doc_string", 3, T.TYPE_STRING),
    ], oneofs=["content"])
    structure = _message("Structure", [
        _field("field", 1, T.TYPE_MESSAGE, _REP, ".onnx.StructTypeProto.Structure.Field"),
    ], nested=[struct_field])
    component = _message("Component", [
        _field("name", 1, T.TYPE_STRING),
        _field("bit_width", 2, T.TYPE_UINT32),
    ])
    bit_packing = _message("BitPacking", [
        _field("component", 1, T.TYPE_MESSAGE, _REP, ".onnx.StructTypeProto.BitPacking.Component"),
        _field("dimension", 2, T.TYPE_UINT64),
    ], nested=[component])
    array = _message("Array", [
        _field("element_type", 1, T.TYPE_MESSAGE, type_name=".onnx.TypeProto"),
        _field("dimension", 2, T.TYPE_UINT64),
    ])
    struct_type = _message("StructTypeProto", [
        _field("array", 1, T.TYPE_MESSAGE, type_name=".onnx.StructTypeProto.Array", oneof_index=0),
        _field("structure", 2, T.TYPE_MESSAGE, type_name=".onnx.StructTypeProto.Structure",
               oneof_index=0),
        _field("bit_packing", 3, T.TYPE_MESSAGE, type_name=".onnx.StructTypeProto.BitPacking",
               oneof_index=0),
        _field("type_ref", 4, T.TYPE_UINT64, oneof_index=0),
        _field("decoder", 5, T.TYPE_MESSAGE, type_name=".onnx.FunctionProto"),
        _field("encoder", 6, T.TYPE_MESSAGE, type_name=".onnx.FunctionProto"),
        _field("name", 7, T.TYPE_STRING),
        _field("doc_string", 8, T.TYPE_STRING),
        _field("metadata_props", 9, T.TYPE_MESSAGE, _REP, ".onnx.StringStringEntryProto"),
        _field("type_id", 10, T.TYPE_UINT64),
    ], nested=[structure, bit_packing, array], oneofs=["kind"])
    binding = _message("PersistentBindingProto", [
        _field("input_name", 1, T.TYPE_STRING),
        _field("output_name", 2, T.TYPE_STRING),
    ])
    return [affine, encoded, struct_type, binding]


def build_file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """onnx-ml.proto plus the onnx-light local extensions, as one self-contained file."""
    fdp = descriptor_pb2.FileDescriptorProto()
    onnx_ml_pb2.DESCRIPTOR.CopyToProto(fdp)
    fdp.name = PROTO_FILE_NAME
    fdp.ClearField("options")  # onnx asks for LITE_RUNTIME; vendors need reflection for text format
    by_name = {m.name: m for m in fdp.message_type}
    T = _F
    type_proto = by_name["TypeProto"]
    value_oneof = [i for i, o in enumerate(type_proto.oneof_decl) if o.name == "value"][0]
    struct_branch = _field("struct_type", 1000, T.TYPE_MESSAGE, type_name=".onnx.StructTypeProto",
                           oneof_index=value_oneof)
    # Declare the new branch after the existing oneof members so a rendered .proto reads back identically.
    fields = list(type_proto.field)
    last_member = max(i for i, f in enumerate(fields) if f.HasField("oneof_index"))
    fields.insert(last_member + 1, struct_branch)
    del type_proto.field[:]
    type_proto.field.extend(fields)
    by_name["GraphProto"].field.extend([
        _field("encoded_initializer", 1000, T.TYPE_MESSAGE, _REP, ".onnx.EncodedValueProto"),
        _field("persistent_bindings", 1001, T.TYPE_MESSAGE, _REP, ".onnx.PersistentBindingProto"),
    ])
    by_name["ModelProto"].field.append(
        _field("struct_types", 1000, T.TYPE_MESSAGE, _REP, ".onnx.StructTypeProto"))
    fdp.message_type.extend(_extension_messages())
    return fdp


POOL = descriptor_pool.DescriptorPool()
FILE = POOL.Add(build_file_descriptor())


def _cls(name: str) -> type[Message]:
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


ModelProto = _cls("ModelProto")
GraphProto = _cls("GraphProto")
NodeProto = _cls("NodeProto")
TypeProto = _cls("TypeProto")
TensorProto = _cls("TensorProto")
TensorShapeProto = _cls("TensorShapeProto")
SparseTensorProto = _cls("SparseTensorProto")
ValueInfoProto = _cls("ValueInfoProto")
FunctionProto = _cls("FunctionProto")
AttributeProto = _cls("AttributeProto")
StringStringEntryProto = _cls("StringStringEntryProto")
OperatorSetIdProto = _cls("OperatorSetIdProto")
AffineLayoutProto = _cls("AffineLayoutProto")
EncodedValueProto = _cls("EncodedValueProto")
StructTypeProto = _cls("StructTypeProto")
PersistentBindingProto = _cls("PersistentBindingProto")

MESSAGE_CLASSES: dict[str, type[Message]] = {
    desc.name: message_factory.GetMessageClass(desc)
    for desc in FILE.message_types_by_name.values()
}


def parse_model(data: bytes) -> Message:
    """Parse ONNX model bytes (with or without extensions) into an extended ModelProto."""
    model = ModelProto()
    model.ParseFromString(data)
    return model


def parse_text(text: str, message_name: str = "ModelProto") -> Message:
    """Parse protobuf text format into the named extended message (conformance cases are text)."""
    return text_format.Parse(text, MESSAGE_CLASSES[message_name]())


def to_text(message: Message) -> str:
    return text_format.MessageToString(message)


def to_onnx(message: Message):
    """Convert an extended message to the plain onnx class of the same name (extensions become unknown)."""
    onnx_cls = getattr(onnx_ml_pb2, message.DESCRIPTOR.name)
    plain = onnx_cls()
    plain.ParseFromString(message.SerializeToString())
    return plain


def from_onnx(message) -> Message:
    """Convert a plain onnx message (or bytes of it) to the extended class of the same name."""
    extended = MESSAGE_CLASSES[message.DESCRIPTOR.name]()
    extended.ParseFromString(message.SerializeToString())
    return extended


__all__ = [
    "AffineLayoutProto", "AttributeProto", "EncodedValueProto", "FunctionProto", "GraphProto",
    "MESSAGE_CLASSES", "ModelProto", "NodeProto", "OperatorSetIdProto", "PersistentBindingProto",
    "SparseTensorProto", "StringStringEntryProto", "StructTypeProto", "TensorProto", "TensorShapeProto",
    "TypeProto", "ValueInfoProto", "DecodeError", "build_file_descriptor", "from_onnx", "parse_model",
    "parse_text", "to_onnx", "to_text",
]
