"""The testee protocol's one definition: every message and field with its documentation. The Python
message classes (conformance/protocol.py) are built from it and conformance/testee.proto, which vendors
compile, is rendered from it (``python -m conformance.protocol_schema --write``; ``--check`` in CI).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import textwrap
from dataclasses import dataclass, field

PACKAGE = "onnx_light.conformance"
PROTO = pathlib.Path(__file__).with_name("testee.proto")

HEADER = (
    "The conformance testee protocol: how a runtime in any language plugs into the suite as a subprocess."
    "\n\n"
    "The runner starts the testee's command line and exchanges messages over its stdin/stdout. Every "
    "message is framed as a 4-byte little-endian unsigned length followed by that many bytes of a "
    "serialized Request (runner -> testee) or Response (testee -> runner). stderr is free for logs."
    "\n\n"
    "Each Request carries an id; the Response to it repeats the id. A testee may answer requests out of "
    "order and must accept a second request while one is still running (the suite checks that a second "
    "call on a busy state is rejected, so a testee must not serialize requests itself)."
    "\n\n"
    "Names (value names, struct field names, feedback pairs) are bytes: a model's names need not be valid "
    "UTF-8, and they must cross the protocol unchanged in both directions."
    "\n\n"
    "A buffer_id names one buffer for the whole life of its state: a testee must never report the same id "
    "for two different buffers while the state is open (keep every buffer it reported alive until the "
    "state closes, or use allocation serials that are never reused). Otherwise a freed copy's reused "
    "address would pass for the retained buffer. See docs/testee-protocol.md."
)



@dataclass(frozen=True)
class Field:
    name: str
    number: int
    kind: str  # a scalar type or a message name; a trailing "*" means repeated
    doc: str = ""
    oneof: str | None = None
    note: str = ""  # a short remark rendered after the field


@dataclass(frozen=True)
class Message:
    name: str
    doc: str = ""
    fields: list[Field] = field(default_factory=list)
    section: str = ""  # starts a new section of the .proto


SCALARS = ("string", "bytes", "int64", "uint64", "uint32", "bool")

#: base_dir of RoundTrip, Export and Rewrite came with protocol version 5; the runner sends it to every
#: testee (an older one ignores the unknown field).
BASE_DIR_NOTE = "protocol 5: directory holding the model's external payload files"

#: HelloResult.features: the testee holds runs at a Hold node (Run.hold and the Hold request).
HOLD_FEATURE = "hold"
#: Tensor and Encoded: whether buffer_id is reported, so an id of 0 is an id and not "unknown".
BUFFER_ID_PRESENCE = ("buffer_id is reported, 0 included. Without it a buffer_id of 0 means unknown (as from a "
                      "testee written before this field).")

SCHEMA: list[Message] = [
    Message("Tensor", doc=(
             "A dense tensor. dtype is a NumPy dtype name (\"float32\", \"int64\", \"bool\", \"bfloat16\", ...); "
                 "data is the row-major little-endian bytes. Text string tensors use dtype \"str\" and strings "
                 "instead of data; byte-string tensors (ONNX STRING values) use dtype \"bytes\" and "
                 "byte_strings."), section="values", fields=[
        Field("dtype", 1, "string"),
        Field("shape", 2, "int64*"),
        Field("data", 3, "bytes"),
        Field("strings", 4, "string*"),
        Field("buffer_id", 5, "uint64", doc=(
            "Identity of the runtime buffer holding the data (a stable address or handle; 0 = unknown)."
        )),
        Field("read_only", 6, "bool", doc="True when the runtime hands this buffer out read-only."),
        Field("strides", 7, "int64*", doc=(
                 "Element strides of a non-contiguous layout; data then holds the span from the first to the "
               "last element. Empty for row-major contiguous data.")),
        Field("byte_strings", 8, "bytes*", doc=(
                 "Elements of a byte-string tensor (dtype \"bytes\"): ONNX strings are bytes and travel "
               "unchanged.")),
        Field("ownerless", 9, "bool", doc=(
                 "The caller lends this buffer for the one call only, like a raw pointer without an owner the "
               "runtime could keep: it must never become a returned output or retained state (and is never "
               "repaired by a copy). The testee passes it to its runtime in that form.")),
        Field("has_buffer_id", 10, "bool", doc=BUFFER_ID_PRESENCE),
    ]),
    Message("StructField", fields=[
        Field("name", 1, "bytes"),
        Field("value", 2, "Value"),
    ]),
    Message("Struct", doc=(
        "A whole structured value. type_id is the catalogue identity when has_type_id is set."
    ), fields=[
        Field("fields", 1, "StructField*"),
        Field("type_id", 2, "uint64"),
        Field("has_type_id", 3, "bool"),
    ]),
    Message("Sequence", fields=[
        Field("items", 1, "Value*"),
    ]),
    Message("Encoded", doc=(
        "A byte-encoded value: header is a serialized onnx.EncodedValueProto without raw_data."
    ), fields=[
        Field("header", 1, "bytes"),
        Field("payload", 2, "bytes"),
        Field("buffer_id", 3, "uint64"),
        Field("read_only", 4, "bool", doc="True when the runtime hands this payload out read-only."),
        Field("has_buffer_id", 5, "bool", doc=BUFFER_ID_PRESENCE),
    ]),
    Message("Value", fields=[
        Field("tensor", 1, "Tensor", oneof="kind"),
        Field("struct", 2, "Struct", oneof="kind"),
        Field("sequence", 3, "Sequence", oneof="kind"),
        Field("encoded", 4, "Encoded", oneof="kind"),
        Field("none", 5, "bool", oneof="kind"),
    ]),
    Message("NamedValue", fields=[
        Field("name", 1, "bytes"),
        Field("value", 2, "Value"),
    ]),
    Message("Hello", section="requests"),
    Message("Verify", fields=[
        Field("model", 1, "bytes"),
        Field("base_dir", 2, "string", note="directory holding the model's external payload files"),
    ]),
    Message("Decode", fields=[
        Field("model", 1, "bytes"),
        Field("value_name", 2, "bytes"),
        Field("base_dir", 3, "string"),
    ]),
    Message("ReadFields", fields=[
        Field("model", 1, "bytes"),
        Field("value_name", 2, "bytes"),
        Field("base_dir", 3, "string"),
    ]),
    Message("RoundTrip", fields=[
        Field("model", 1, "bytes"),
        Field("base_dir", 2, "string", note=BASE_DIR_NOTE),
    ]),
    Message("OpenState", fields=[
        Field("model", 1, "bytes"),
        Field("initial", 2, "NamedValue*"),
        Field("base_dir", 3, "string"),
    ]),
    Message("Run", fields=[
        Field("state", 1, "uint64"),
        Field("feeds", 2, "NamedValue*"),
        Field("cancelled", 3, "bool", doc=(
                 "Cancellation is requested before the call starts (protocol version 2): the runtime must "
               "reject it with STATE_CANCELLED and leave the state as it was.")),
        Field("hold", 4, "bool", doc=(
                 "Hold this call (protocol version 4): when it reaches the model's onnx_light.conformance.Hold "
               "node (an identity) it parks there, active, until a Hold request with release = true for this "
               "state.")),
    ]),
    Message("Values", fields=[
        Field("state", 1, "uint64"),
    ]),
    Message("Reset", fields=[
        Field("state", 1, "uint64"),
        Field("initial", 2, "NamedValue*"),
    ]),
    Message("Close", fields=[
        Field("state", 1, "uint64"),
    ]),
    Message("Export", fields=[
        Field("model", 1, "bytes"),
        Field("target", 2, "string", note="\"onnx-light\" (save/load), \"onnx\" (standard), \"onnx-lowered\""),
        Field("base_dir", 3, "string", note=BASE_DIR_NOTE),
    ]),
    Message("Rewrite", fields=[
        Field("model", 1, "bytes"),
        Field("rewrite_json", 2, "string",
              note='{"kind": "rename", "old": ..., "new": ...} and the other kinds in the docs'),
        Field("base_dir", 3, "string", note=BASE_DIR_NOTE),
    ]),
    Message("Shutdown"),
    Message("Counters", doc=("The runtime's own counters for an open state (protocol version 3); see "
                 "docs/testee-protocol.md for the names the suite reads. A runtime that keeps none answers "
                 "NotSupported."), fields=[
        Field("state", 1, "uint64"),
    ]),
    Message("Hold", doc=("The held run on a state (protocol version 4; see Run.hold). Without release, answered Ok "
                 "once the run has parked at its Hold node (rejected if it ended without parking). With "
                 "release, requests the run's cancellation first when cancel is set (as a caller cancelling "
                 "a running call), then lets it continue; answered Ok at once."), fields=[
        Field("state", 1, "uint64"),
        Field("release", 2, "bool"),
        Field("cancel", 3, "bool"),
    ]),
    Message("Request", fields=[
        Field("id", 1, "uint64"),
        Field("hello", 2, "Hello", oneof="op"),
        Field("verify", 3, "Verify", oneof="op"),
        Field("decode", 4, "Decode", oneof="op"),
        Field("read_fields", 5, "ReadFields", oneof="op"),
        Field("roundtrip", 6, "RoundTrip", oneof="op"),
        Field("open_state", 7, "OpenState", oneof="op"),
        Field("run", 8, "Run", oneof="op"),
        Field("values", 9, "Values", oneof="op"),
        Field("reset", 10, "Reset", oneof="op"),
        Field("close", 11, "Close", oneof="op"),
        Field("export", 12, "Export", oneof="op"),
        Field("rewrite", 13, "Rewrite", oneof="op"),
        Field("shutdown", 14, "Shutdown", oneof="op"),
        Field("counters", 15, "Counters", oneof="op"),
        Field("hold", 16, "Hold", oneof="op"),
    ]),
    Message("OperatorRole", doc=(
             "Which operator implements one of the roles the suite's models use (docs/testee-protocol.md "
                 "lists the roles, their signatures and their default domain and op_type). Roles not listed "
                 "keep the default."), section="responses", fields=[
        Field("role", 1, "string"),
        Field("domain", 2, "string"),
        Field("op_type", 3, "string"),
    ]),
    Message("HelloResult", fields=[
        Field("name", 1, "string"),
        Field("version", 2, "string"),
        Field("profiles", 3, "string*"),
        Field("protocol_version", 4, "uint32",
              note=("5 (4: RoundTrip, Export and Rewrite without base_dir; 3: no Run.hold; 2: string names, "
                    "no causes or counters; 1: no Run.cancelled)")),
        Field("operators", 5, "OperatorRole*", note="protocol 3"),
        Field("features", 6, "string*", doc=(
                 f"The optional features the testee implements, read when has_features is set: \"{HOLD_FEATURE}\" "
               "(Run.hold and the Hold request). A testee without has_features has every feature of its "
               "protocol_version. What a state may or may not do (cancellation, counters) is answered per "
               "request with NotSupported instead.")),
        Field("has_features", 7, "bool"),
    ]),
    Message("Ok"),
    Message("ValueResult", fields=[
        Field("value", 1, "Value"),
    ]),
    Message("NamedValues", fields=[
        Field("values", 1, "NamedValue*"),
        Field("received", 2, "NamedValue*", doc=(
                 "For Run: the feeds as the testee received them, with buffer_id set and no data, so buffer "
               "identities on both sides of the process boundary refer to the testee's own buffers.")),
    ]),
    Message("FeedbackPair", fields=[
        Field("input_name", 1, "bytes"),
        Field("output_name", 2, "bytes"),
    ]),
    Message("ModelResult", fields=[
        Field("model", 1, "bytes"),
        Field("feedback", 2, "FeedbackPair*"),
        Field("has_feedback", 3, "bool"),
    ]),
    Message("StateOpened", doc=(
             "Answers OpenState and Reset; received lists the initial values as the testee holds them "
                 "(buffer_id set, no data)."), fields=[
        Field("state", 1, "uint64"),
        Field("received", 2, "NamedValue*"),
    ]),
    Message("Rejection", doc=(
             "A rejection. code is one of the suite's error codes (reference_impl/errors.py), or empty "
                 "when the runtime has no mapping for its own error."), fields=[
        Field("code", 1, "string"),
        Field("message", 2, "string"),
        Field("causes", 3, "string*", doc=(
                 "The codes of what made this failure happen (a run failing with STATE_RUN_FAILED because an "
               "append was invalid lists KV_SHAPE_MISMATCH). Optional; when present, a case expecting a "
               "cause checks it.")),
    ]),
    Message("NotSupported", fields=[
        Field("reason", 1, "string"),
    ]),
    Message("InternalError", doc=(
        "The testee failed in a way it did not classify: the case fails with this message."
    ), fields=[
        Field("message", 1, "string"),
        Field("traceback", 2, "string"),
    ]),
    Message("Counter", fields=[
        Field("name", 1, "string"),
        Field("value", 2, "int64"),
    ]),
    Message("CounterValues", fields=[
        Field("counters", 1, "Counter*"),
    ]),
    Message("Response", fields=[
        Field("id", 1, "uint64"),
        Field("hello", 2, "HelloResult", oneof="result"),
        Field("ok", 3, "Ok", oneof="result"),
        Field("value", 4, "ValueResult", oneof="result"),
        Field("values", 5, "NamedValues", oneof="result"),
        Field("model", 6, "ModelResult", oneof="result"),
        Field("state", 7, "StateOpened", oneof="result"),
        Field("rejected", 8, "Rejection", oneof="result"),
        Field("not_supported", 9, "NotSupported", oneof="result"),
        Field("error", 10, "InternalError", oneof="result"),
        Field("counters", 11, "CounterValues", oneof="result"),
    ]),
]


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}// {line}" for line in textwrap.wrap(text, 101 - len(indent), break_on_hyphens=False)]


def render() -> str:
    """conformance/testee.proto, as vendors compile it."""
    out = []
    for index, paragraph in enumerate(HEADER.split("\n\n")):
        if index:
            out.append("//")
        out += _comment(paragraph, "")
    out += ["", 'syntax = "proto3";', "", f"package {PACKAGE};"]
    for message in SCHEMA:
        out.append("")
        if message.section:
            out += [f"// {'-' * (96 - len(message.section))} {message.section}", ""]
        if message.doc:
            out += _comment(message.doc, "")
        if not message.fields:
            out.append(f"message {message.name} {{}}")
            continue
        out.append(f"message {message.name} {{")
        open_oneof = None
        for item in message.fields:
            if item.oneof != open_oneof:
                if open_oneof:
                    out.append("  }")
                if item.oneof:
                    out.append(f"  oneof {item.oneof} {{")
                open_oneof = item.oneof
            indent = "    " if item.oneof else "  "
            out += _comment(item.doc, indent)
            label = "repeated " if item.kind.endswith("*") and not item.oneof else ""
            note = f"  // {item.note}" if item.note else ""
            out.append(f"{indent}{label}{item.kind.rstrip('*')} {item.name} = {item.number};{note}")
        if open_oneof:
            out.append("  }")
        out.append("}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.protocol_schema", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when conformance/testee.proto is stale")
    parser.add_argument("--write", action="store_true", help="rewrite conformance/testee.proto")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        PROTO.write_text(text)
    elif args.check:
        if PROTO.read_text() != text:
            print(f"{PROTO} is stale: python -m conformance.protocol_schema --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
