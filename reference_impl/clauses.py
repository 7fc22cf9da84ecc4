"""The normative clauses of the contract, each with a stable ID.

Every error code names the clause it enforces, tests mark the clauses they cover
(``@pytest.mark.clause("ID")``), and conformance cases cite them, so coverage of the spec is checkable.
Text is quoted from ``custom-quantized-persistent-values.txt`` (revision ``SPEC_REVISION``).
"""

from __future__ import annotations

from dataclasses import dataclass

SPEC_NAME = "Custom, quantized, and persistent values"
SPEC_REVISION = "2026-10-02"


@dataclass(frozen=True)
class Clause:
    id: str
    section: str
    text: str


_CLAUSES = [
    # --- Wire contract -----------------------------------------------------------------------------
    ("WIRE-FIELDS", "Struct types and byte-encodable layouts",
     "TypeProto.struct_type, GraphProto.encoded_initializer and ModelProto.struct_types each use field "
     "1000 in their respective messages."),
    ("WIRE-BINDINGS-FIELD", "Graph-level persistence declaration",
     "repeated PersistentBindingProto persistent_bindings = 1001; Field 1001 belongs to the reserved "
     "local extension range."),
    ("WIRE-LOCAL-EXTENSION", "GraphBuilder, shape inference and serialization",
     "The new binding field is a local ONNX extension, not a change required of upstream ONNX."),
    # --- Affine branch -------------------------------------------------------------------------------
    ("AFF-STORAGE", "Struct types and byte-encodable layouts",
     "storage_type is one of INT8, UINT8, INT4, UINT4, INT2 or UINT2."),
    ("AFF-PACKING", "Struct types and byte-encodable layouts",
     "raw_data or the external payload contains only row-major codes using the corresponding "
     "TensorProto.raw_data packing. Four-bit types pack two codes per byte and two-bit types pack four, "
     "starting with the least-significant bits; unused final high bits are zero."),
    ("AFF-SCALE", "Struct types and byte-encodable layouts",
     "scale is a scalar or parameter tensor with floating element type."),
    ("AFF-ZERO-POINT", "Struct types and byte-encodable layouts",
     "zero_point is optional, has storage_type, and defaults to zero."),
    ("AFF-AXIS", "Struct types and byte-encodable layouts",
     "Omitting axis selects per-tensor quantization. Setting axis selects per-axis parameters."),
    ("AFF-BLOCK", "Struct types and byte-encodable layouts",
     "block_size is valid only with an axis and selects blocked quantization along it."),
    ("AFF-DQ", "Struct types and byte-encodable layouts",
     "Parameter shapes, axis normalization, code packing and decoded values follow the corresponding "
     "QuantizeLinear/DequantizeLinear contract."),
    ("AFF-LOGICAL", "Struct types and byte-encodable layouts",
     "logical_type must be a tensor type with concrete dimensions for the affine branch."),
    ("AFF-PAYLOAD-SIZE", "Struct types and byte-encodable layouts",
     "For n logical elements, the code payload is exactly ceil(n * bit_width(storage_type) / 8) bytes."),
    ("ENC-LOGICAL-EXACT", "Struct types and byte-encodable layouts",
     "logical_type may be omitted for a custom struct without tensor semantics; when present, the decoder "
     "or native consumer must produce that exact type and shape."),
    ("ENC-LAYOUT", "Representation model",
     "Layout is either a built-in dense/affine form or a concrete StructTypeProto reference."),
    # --- Catalogue and identity ----------------------------------------------------------------------
    ("CAT-ID-NONZERO", "Catalogue and identity contract",
     "type_id is a nonzero, model-scoped stable format identity."),
    ("CAT-ID-UNIQUE", "Catalogue and identity contract",
     "Each ID has exactly one declaration in ModelProto.struct_types; duplicate IDs are invalid."),
    ("CAT-REF-RESOLVED", "Catalogue and identity contract", "Unresolved references are invalid."),
    ("CAT-REF-ACYCLIC", "Catalogue and identity contract", "Reference cycles are invalid."),
    ("CAT-REORDER", "Catalogue and identity contract",
     "Reordering the catalogue does not change identity."),
    ("CAT-REF-ONLY-ID", "Catalogue and identity contract",
     "A type_ref contains only the referenced ID: declaration fields, metadata, codecs and another kind "
     "must be absent."),
    ("CAT-INLINE-NO-ID", "Catalogue and identity contract",
     "An inline declaration has no type_id and cannot be referenced."),
    ("CAT-ID-CHANGE", "Catalogue and identity contract",
     "Changing fields, constants, physical layout, decoder or encoder requires a new ID."),
    ("CAT-KINDLESS", "Catalogue and identity contract",
     "A StructTypeProto with no kind remains an unconstrained category only inside TypeProto; it is never "
     "a declaration or encoded layout."),
    ("CAT-DECL-CONCRETE", "Catalogue and identity contract",
     "A concrete declaration selects array, bit_packing or structure."),
    ("INIT-NAMES-UNIQUE", "Catalogue and identity contract",
     "GraphProto.encoded_initializer names graph constants. Names are unique across dense, sparse and "
     "encoded initializers and may also appear in graph inputs."),
    ("GRAPH-STRUCT-IO", "Catalogue and identity contract",
     "A structured graph input or output uses TypeProto.struct_type; tensor-only operators do not accept "
     "it without an explicit decoder or registered consumer."),
    # --- Payload and lifetime ------------------------------------------------------------------------
    ("PAY-EXCLUSIVE", "Payload and lifetime contract",
     "raw_data and external_data are mutually exclusive."),
    ("PAY-EXTERNAL-KEYS", "Payload and lifetime contract",
     "data_location == EXTERNAL requires external_data with location and explicit length; offset is "
     "optional. Default location uses raw_data."),
    ("PAY-EXTERNAL-EXTENT", "One element type, many payload lengths",
     "External data must supply an explicit length and a valid backing-file extent."),
    ("PAY-EMPTY", "Payload and lifetime contract", "An empty inline payload represents zero records."),
    ("PAY-VALIDATE-FIRST", "Payload and lifetime contract",
     "Payload bounds and layout are validated before any decoder or native callback runs."),
    ("PAY-NO-POINTERS", "Payload and lifetime contract",
     "Serialized records never contain pointers, native padding, vtables or process-local handles."),
    ("PAY-OWNERLESS", "Payload and lifetime contract",
     "On the persistent execution path, an invocation-only ownerless borrow cannot become a returned "
     "output or retained state: the producer must supply a lifetime owner or transfer its allocation."),
    ("PAY-UNSUPPORTED-OWNERSHIP", "Payload and lifetime contract",
     "Unsupported ownership is rejected explicitly, never repaired by a hidden payload copy."),
    ("PAY-EXTERNAL-OWNER", "Payload and lifetime contract",
     "External mapped bytes retain their mapping owner."),
    ("PAY-ARENA", "Payload and lifetime contract",
     "Arena storage must remain valid through a retained allocation/owner and cannot be recycled while "
     "referenced."),
    ("PAY-READ-ONLY", "Payload and lifetime contract",
     "Encoded inputs are read-only in the first implementation."),
    ("DEC-KEYED", "Payload and lifetime contract",
     "Native bindings are keyed by type_id and verify the resolved declaration before creating a typed "
     "view."),
    ("DEC-INLINE-CODEC", "Payload and lifetime contract",
     "Inline custom layouts require generic field access or an explicit codec."),
    ("DEC-MISSING", "Payload and lifetime contract",
     "Missing consumers fail explicitly; loading a model never executes codec code."),
    ("DEC-ROOT-ONLY", "Byte-encoding rules and validation",
     "Only the concrete root's decoder or encoder is invoked; a nested type_ref contributes layout and "
     "constants but not its own decoder/encoder."),
    ("ENC-STRUCT-LAYOUT", "Payload and lifetime contract",
     "EncodedValueProto.struct_type selects an exact type_ref or a concrete inline declaration eligible "
     "for byte encoding."),
    # --- Struct declarations -------------------------------------------------------------------------
    ("DECL-WELLFORMED", "Byte-encoding rules and validation",
     "Type checking rejects malformed declarations (structural, naming, type and count errors)."),
    ("DECL-FIELD-CONTENT", "Struct types and byte-encodable layouts",
     "Each field selects either a value type or a tensor constant."),
    ("DECL-COUNTS-CONCRETE", "Payload and lifetime contract",
     "Array lengths and bit-packing counts stay explicit concrete integers."),
    ("DECL-TYPE-RULES", "Payload and lifetime contract",
     "Field.type and Array.element_type use TypeProto and its existing validation rules for tensors, "
     "nested structs, sequences, maps and optional values."),
    ("DECL-CONSTANT", "Payload and lifetime contract",
     "Field.constant is the actual TensorProto value, not a graph input, and must have concrete "
     "dimensions and matching data."),
    ("DECL-DEPTH", "Catalogue and identity contract",
     "Implementation limit, not a spec rule: types nest at most 64 levels, counting every TypeProto and "
     "every type_ref expansion, on every declaration whether used or not (onnx-light's "
     "kMaxStructTypeDepth); cases that rely on it alone are Recommended."),
    # --- Byte encoding -------------------------------------------------------------------------------
    ("ENC-SIZE-TABLE", "Byte-encoding rules and validation",
     "For a byte-encodable struct, compute sizes recursively in bits with checked uint64 arithmetic."),
    ("ENC-OVERFLOW", "Byte-encoding rules and validation",
     "Type checking rejects, for byte encoding, overflowing size arithmetic."),
    ("ENC-FIXED-SIZE", "Payload and lifetime contract",
     "For byte encoding, every non-constant field must resolve recursively to fixed-size inline data; "
     "such a struct remains a valid runtime type but cannot select the raw/external byte-payload layout."),
    ("ENC-LEAVES", "Byte-encoding rules and validation",
     "Only fixed-width ONNX scalar leaves are physical data, and every read is bounds-checked."),
    ("ENC-ROOT-SIZE", "Byte-encoding rules and validation",
     "The encoded root must have strictly positive size divisible by eight."),
    ("ENC-CONSTANT-ONLY", "Byte-encoding rules and validation",
     "Constant-only structs are valid types but cannot be encoding roots, though nested constant-only "
     "groups may contribute zero bytes."),
    ("ENC-BIT-ORDER", "Byte-encoding rules and validation",
     "Arrays and bit packings are tight, fields follow declaration order, and padding is explicit; bits "
     "run least-to-most-significant, multi-byte values little-endian."),
    ("ENC-RECORD-COUNT", "One element type, many payload lengths",
     "element_bytes > 0; payload_bytes % element_bytes == 0; element_count = payload_bytes / "
     "element_bytes; partial records are rejected."),
    ("ENC-NO-COUNT-IN-TYPE", "One element type, many payload lengths",
     "No physical shape or redundant count is serialized, and a different count does not create a new "
     "type."),
    ("ENC-NO-IMPLICIT-TENSOR", "One element type, many payload lengths",
     "A byte length never lets a tensor-only operator accept encoded bytes implicitly."),
    ("ENC-UNALIGNED", "Quantization examples",
     "The INT64 at byte offset 68 is not necessarily aligned, so typed readers must handle it."),
    # --- Persistent state ----------------------------------------------------------------------------
    ("BIND-EXACT-NAMES", "Graph-level persistence declaration",
     "Names identify exact whole inputs and outputs of the declaring graph. Dots and backslashes in "
     "names are literal characters."),
    ("BIND-WHOLE", "Graph-level persistence declaration",
     "An input is entirely persistent or not persistent; partial field selection is unsupported."),
    ("BIND-ROOT-ONLY", "Graph-level persistence declaration",
     "Persistent bindings in control-flow subgraphs are rejected explicitly until scoped state is "
     "supported."),
    ("BIND-SHARED-TYPE", "Whole structured inputs",
     "The graph binding selects a whole value, with no persistent flag on the shared struct type or "
     "encoded value; two values sharing one struct type can have different persistence bindings."),
    ("BIND-STATELESS-DEFAULT", "Graph-level persistence declaration",
     "No bindings means ordinary stateless execution."),
    ("BIND-COMPATIBLE", "Minimal rules",
     "Every selected graph input/output must exist with compatible types, representation contracts and "
     "shape constraints."),
    ("BIND-NO-STRINGS", "Minimal rules",
     "String tensors cannot be persistent, including nested tensor fields and constants in selected whole "
     "structures or encoded layouts."),
    ("BIND-DUPLICATES", "Minimal rules", "Duplicate input/output selections are errors."),
    ("STATE-INITIAL", "Minimal rules",
     "Missing initial values are errors; initial contents must still be supplied."),
    ("STATE-FEEDS", "Minimal rules",
     "Every required whole input comes from current feeds or retained state; current feeds overriding "
     "retained inputs are errors."),
    ("STATE-ATOMIC", "Minimal rules",
     "Retained values update only after successful execution and validation."),
    ("STATE-NO-CONCURRENCY", "Minimal rules",
     "Simultaneous calls on the same state are rejected."),
    ("STATE-RESET-CLOSE", "Minimal rules",
     "reset(initial) restores caller-supplied initial values; close releases retained values, and neither "
     "may race with an active call."),
    ("STATE-ISOLATION", "Minimal rules", "Each request owns its state bindings."),
    ("STATE-RESOLVE-ONCE", "Graph-level persistence declaration",
     "make_state resolves the model's bindings and types once, after graph rewrites."),
    ("STATE-NO-MODEL-SCAN", "Graph-level persistence declaration",
     "State construction and subsequent calls must not serialize, clone, hash or repeatedly compare the "
     "model to detect mutation."),
    ("STATE-EQUIV-LOOP", "Graph-level persistence declaration",
     "The helper is equivalent to the ordinary stateless output-to-input loop."),
    ("STATE-UNSELECTED", "Whole structured inputs",
     "Fresh values belong to separate graph inputs; unselected outputs are not retained."),
    ("STATE-WHOLE-STRUCT", "Whole structured inputs",
     "The same mapping can retain an entire structured input."),
    ("ZC-RETAIN", "Zero-copy ownership",
     "PR04 must retain/share/move existing backing storage for initialization, reset, per-call feeds, "
     "selected outputs and next-call inputs; copying tensor or encoded payload bytes for state management "
     "is not allowed."),
    ("ZC-VIEWS", "Zero-copy ownership",
     "State-value access returns lifetime-safe shared views, not implicit deep-copy snapshots."),
    ("ZC-ENTRY-POINTS", "Zero-copy ownership",
     "NumPy and PyTorch entry points must retain supported source buffers without materializing payload "
     "copies, or report unsupported layouts/ownership explicitly."),
    ("ZC-OUTSTANDING", "Zero-copy ownership",
     "Releasing caller references, resetting/closing a state or advancing another invocation must not "
     "invalidate an outstanding view."),
    ("ZC-TRANSPORT", "Zero-copy ownership",
     "Functions, If and structured field transport must preserve these owners rather than call deep-copy "
     "or serialization-based detachment helpers."),
    ("ZC-NO-INPLACE", "Zero-copy ownership",
     "It must not silently enable in-place reuse of an allocation still referenced by the previous state "
     "or a returned output."),
    ("ZC-FAILURE", "Zero-copy ownership",
     "Failure or cancellation leaves the previous state and its buffers valid; it must not require a "
     "backup copy."),
    ("ZC-READ-ONLY", "Zero-copy ownership",
     "Callers and kernels must treat these buffers as read-only while shared or retained."),
    ("EXP-PRESERVE", "GraphBuilder, shape inference and serialization",
     "GraphBuilder must author and preserve GraphProto.persistent_bindings through import/export, graph "
     "copying, renaming and optimization."),
    ("EXP-RENAME", "GraphBuilder, shape inference and serialization",
     "Renaming an input/output updates its binding; a rewrite removing or changing a selected "
     "input/output must update the declaration consistently or fail, never silently drop it."),
    ("EXP-STANDARD", "GraphBuilder, shape inference and serialization",
     "Standard ONNX export must reject persistence declarations unless an explicit lowering to a stateless "
     "graph and caller-managed feedback preserves the contract."),
    ("EXP-STRUCT", "GraphBuilder, shape inference and serialization",
     "Unsupported field-value export fails explicitly rather than dropping dynamic fields."),
    # --- KV caches -----------------------------------------------------------------------------------
    ("KV-APPEND", "Implementation sequence",
     "Append touches only new tokens and matches functional execution."),
    ("KV-CAPACITY", "Ownership and acceptance",
     "Invalid capacities and failed mutations are covered by acceptance; fixed-capacity reuse is "
     "demonstrated."),
    ("KV-PAGED", "Quantized and paged caches use the same feedback",
     "Each K/V block may use a different EncodedValueProto layout, provided its decoded type and geometry "
     "satisfy the consumer contract. The block's logical token range and valid length are value data."),
    ("KV-BOUNDED", "Quantized and paged caches use the same feedback",
     "Acceptance measures bounded workspace and no full-cache copy or dequantization."),
    ("KV-ATTENTION", "Implementation sequence",
     "Attention over the cache matches the functional (dense) computation."),
]

CLAUSES: dict[str, Clause] = {cid: Clause(cid, section, text) for cid, section, text in _CLAUSES}
