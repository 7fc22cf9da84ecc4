"""The normative clauses of the contract, each with a stable ID and the spec's own words.

Every normative statement of ``custom-quantized-persistent-values.txt`` (revision ``SPEC_REVISION``)
belongs to exactly one clause; a clause quotes its statements verbatim (``tests/test_clauses.py`` checks
each quote against the spec and that no normative sentence is left without a clause). Error codes name
the clause they enforce, tests mark the clauses they cover (``@pytest.mark.clause("ID")``), conformance
cases cite them, and the suite's audit proves a wrong implementation of each clause is caught.

``kind`` says how a clause can be checked:

- ``rule``: a requirement a runtime's observable behaviour must meet (Required cases cite these);
- ``permission``: something the spec allows, so every allowed behaviour must pass;
- ``internal``: a property of a runtime's internals (its model object, its schema) that the adapter
  interface cannot observe; tests check it on the oracle;
- ``native``: about native (C++) interfaces that no runtime-neutral adapter can observe;
- ``size``: a binary-size requirement, checked by ``size_gate`` on a built library, not by cases;
- ``process``: how the project is developed or measured (reviews, reports, baselines);
- ``limit``: not a spec statement but an implementation limit the oracle shares with onnx-light
  (conformance cases for limits are Recommended).
"""

from __future__ import annotations

from dataclasses import dataclass

SPEC_NAME = "Custom, quantized, and persistent values"
SPEC_REVISION = "2026-10-02"
SPEC_FILE = "custom-quantized-persistent-values.txt"

KINDS = ("rule", "permission", "internal", "native", "size", "process", "limit")
#: kinds whose statements a conformance case can observe through an adapter
TESTABLE_KINDS = ("rule", "permission")


@dataclass(frozen=True)
class Clause:
    id: str
    section: str
    kind: str
    quotes: tuple[str, ...]
    note: str = ""

    @property
    def text(self) -> str:
        """The clause's statements as the spec words them (a limit's text is its note)."""
        return " ... ".join(self.quotes) if self.quotes else self.note

    @property
    def testable(self) -> bool:
        return self.kind in TESTABLE_KINDS


_OBJ = "Objective and consolidation"
_REP = "Representation model: a small quantized core plus generic structs"
_WIRE = "Struct types and byte-encodable layouts"
_CAT = "Catalogue and identity contract"
_PAY = "Payload and lifetime contract"
_ENC = "Byte-encoding rules and validation"
_MANY = "One element type, many payload lengths"
_QEX = "Quantization examples: constants and per-value parameters"
_CB = "Codebook quantization through a shared subtype"
_SIZE = "Proto-library size gate"
_PREP = "Interoperability with prepared execution"
_DECL = "Graph-level persistence declaration"
_WHOLE = "Whole structured inputs"
_MIN = "Minimal rules"
_ZC = "Zero-copy ownership from the first state implementation"
_PAGED = "Quantized and paged caches use the same feedback"
_GB = "GraphBuilder, shape inference and serialization"
_SEQ = "Implementation sequence"
_OWN = "Ownership and acceptance"

# (id, section, kind, quotes, note)
_CLAUSES: list[tuple[str, str, str, tuple[str, ...], str]] = [
    # --- Objective, representation model --------------------------------------------------------------
    ("STATE-EQUIV-LOOP", _DECL, "rule", (
        "Persistent state is declared by GraphProto.persistent_bindings, an explicit mapping of model outputs "
        "back to inputs, not a separate state system.",
        "This helper is equivalent to the ordinary stateless loop:",
        "compare encoded versus decoded computation and the state helper versus a manual output-to-input loop",
    ), ""),
    ("STATE-MODEL-IMMUTABLE", _DECL, "internal", (
        "The model is immutable once bound to a session.",
        "The model must remain immutable for the lifetime of the bound session.",
    ), "Observable as: running a state never changes what an explicit save of the model gives."),
    ("REP-CLOSED-SET", _OBJ, "process", (
        "Only a small closed set of common quantized forms gets specialized proto support.",
        "The initial specialized subset is frozen in PR01; additional built-in forms require demonstrated "
        "common use and a proto-size review.",
        "Other affine forms use a structured layout instead of extending this message.",
    ), "The closed set itself is AFF-STORAGE; extending it is a design-review matter."),
    ("REP-STATIC-SUBSET", _REP, "permission", (
        "a struct need not have a fixed physical size.",
        "fixed physical size is an eligibility condition for byte encoding, not a requirement on every struct.",
    ), ""),
    ("ENC-LAYOUT", _REP, "rule", (
        "Layout is either a built-in dense/affine form or a concrete StructTypeProto reference.",
    ), "The wire schema's layout oneof offers affine and struct_type only; there is no separate built-in dense "
       "layout message, so an encoded value selecting neither has no layout."),
    ("REP-TENSORPROTO-COMPAT", _REP, "rule", (
        "existing TensorProto values keep working unmigrated via a common runtime view.",
    ), ""),
    ("PAY-FIELD-OWNERS", _PAY, "rule", (
        "grouping independently owned field buffers via StructTypeProto rather than inline pointers",
        "Runtime structs retain each field’s owner independently",
    ), ""),
    ("DEC-MISSING-INPUT", _REP, "rule", (
        "fully custom structures use the same mechanism, failing explicitly when a graph input has no consumer "
        "or decoder.",
    ), ""),
    ("DEC-PROVED-COMPATIBLE", _REP, "native", (
        "A registered native C++ type can bind a descriptor to a typed view or an owned runtime object; "
        "zero-copy access requires proved compatibility.",
    ), "Observable part: DEC-KEYED (a registered decoder refuses a declaration it was not made for)."),
    ("ENC-PER-VALUE-PARAMS", _REP, "rule", (
        "Per-weight scales and zero points belong in value storage, not the catalogue; only true format "
        "constants belong to the type, serialized once in the shared StructTypeProto declaration while each "
        "value stores only codes, as shown below.",
        "Only true shared format constants belong here; mutable lengths, positions and per-block quantization "
        "parameters remain instance data.",
    ), "Observable as: each value decodes with its own parameters while sharing one type."),
    # --- Wire contract --------------------------------------------------------------------------------
    ("WIRE-LOCAL-RANGE", _WIRE, "rule", (
        "Field numbers 1000–1099 are reserved for local onnx-light extensions so future upstream ONNX fields "
        "can continue using the low-numbered range.",
    ), ""),
    ("WIRE-FIELDS", _WIRE, "rule", (
        "TypeProto.struct_type, GraphProto.encoded_initializer and ModelProto.struct_types each use field 1000 "
        "in their respective messages.",
    ), ""),
    ("WIRE-SCHEMA", _WIRE, "rule", (
        "PR01 freezes the following wire contract.",
    ), "Every field of AffineLayoutProto, EncodedValueProto and StructTypeProto at the number the spec gives."),
    ("WIRE-BINDINGS-FIELD", _DECL, "rule", (
        "repeated PersistentBindingProto persistent_bindings = 1001;",
        "Field 1001 belongs to the reserved local extension range; existing representation field numbers "
        "remain unchanged.",
    ), ""),
    ("WIRE-LOCAL-EXTENSION", _GB, "rule", (
        "The new binding field is a local ONNX extension, not a change required of upstream ONNX or a "
        "dependency on proto inheritance.",
    ), "Observable as: a model with bindings still parses with upstream onnx (the extensions as unknown fields)."),
    ("WIRE-NO-PREPARED", _PREP, "internal", (
        "The representation layer exposes only enough validated type, layout and payload information for a "
        "prepared consumer to bind a typed view, adding no preparation provenance to EncodedValueProto and no "
        "prepared_values field to ModelProto.",
    ), ""),
    ("WIRE-ROUNDTRIP", _SEQ, "rule", (
        "Round-trip tensor/sequence fields, byte-encoded custom records, codebook/mixed-bit formats and a "
        "heterogeneous KV-block fixture, proving one type shared across payload lengths within the binary-size "
        "budget.",
        "Type/value tests round-trip two encoded values sharing a type ID but different payload lengths and "
        "record counts",
    ), ""),
    # --- Affine branch --------------------------------------------------------------------------------
    ("AFF-STORAGE", _WIRE, "rule", (
        "storage_type is one of INT8, UINT8, INT4, UINT4, INT2 or UINT2.",
    ), ""),
    ("AFF-ROW-MAJOR", _WIRE, "rule", (
        "raw_data or the external payload contains only row-major codes using the corresponding "
        "TensorProto.raw_data packing.",
    ), ""),
    ("AFF-PACKING", _WIRE, "rule", (
        "Four-bit types pack two codes per byte and two-bit types pack four, starting with the "
        "least-significant bits;",
    ), ""),
    ("AFF-PADDING-ZERO", _WIRE, "rule", (
        "unused final high bits are zero.",
    ), ""),
    ("AFF-SCALE", _WIRE, "rule", (
        "scale is a scalar or parameter tensor with floating element type;",
    ), "Every floating type ONNX defines for DequantizeLinear's scale (FLOAT, FLOAT16, BFLOAT16); the logical element "
       "type may be another of them (DequantizeLinear's output_dtype). A DOUBLE scale decoding to DOUBLE is the "
       "suite's extension (DequantizeLinear has neither), so its case is Recommended."),
    ("AFF-ZERO-POINT", _WIRE, "rule", (
        "zero_point is optional, has storage_type, and defaults to zero.",
    ), ""),
    ("AFF-AXIS", _WIRE, "rule", (
        "Omitting axis selects per-tensor quantization. Setting axis selects per-axis parameters.",
    ), ""),
    ("AFF-BLOCK", _WIRE, "rule", (
        "block_size is valid only with an axis and selects blocked quantization along it.",
    ), ""),
    ("AFF-DQ", _WIRE, "rule", (
        "Parameter shapes, axis normalization, code packing and decoded values follow the corresponding "
        "QuantizeLinear/DequantizeLinear contract.",
    ), ""),
    ("AFF-LOGICAL", _WIRE, "rule", (
        "logical_type must be a tensor type with concrete dimensions for the affine branch.",
    ), ""),
    ("AFF-PAYLOAD-SIZE", _WIRE, "rule", (
        "For n logical elements, the code payload is exactly ceil(n * bit_width(storage_type) / 8) bytes.",
    ), ""),
    ("ENC-LOGICAL-OPTIONAL", _WIRE, "permission", (
        "It may be omitted for a custom struct without tensor semantics;",
        "the logical shape (decoder- or kernel-exposed dimensions)",
    ), ""),
    ("ENC-LOGICAL-EXACT", _WIRE, "rule", (
        "when present, the decoder or native consumer must produce that exact type and shape.",
    ), ""),
    # --- Catalogue and identity -----------------------------------------------------------------------
    ("CAT-ID-NONZERO", _CAT, "rule", (
        "type_id is a nonzero, model-scoped stable format identity.",
    ), ""),
    ("CAT-ID-UNIQUE", _CAT, "rule", (
        "Each ID has exactly one declaration in ModelProto.struct_types;",
        "duplicate IDs, unresolved references and reference cycles are invalid.",
    ), ""),
    ("CAT-REF-RESOLVED", _CAT, "rule", ("unresolved references",), "Unresolved references are invalid."),
    ("CAT-REF-ACYCLIC", _CAT, "rule", ("reference cycles are invalid.",), ""),
    ("CAT-REORDER", _CAT, "rule", (
        "Reordering the catalogue does not change identity.",
        "covering catalogue reordering",
    ), ""),
    ("CAT-ID-CHANGE", _CAT, "rule", (
        "Changing fields, constants, physical layout, decoder or encoder requires a new ID.",
        "changing the constants requires a new type ID.",
        "changing its codebook requires a new subtype ID.",
    ), "Observable as: a decoder registered for a type_id refuses a declaration that changed under that ID."),
    ("CAT-REF-ONLY-ID", _CAT, "rule", (
        "A type_ref contains only the referenced ID: declaration fields, metadata, codecs and another kind must "
        "be absent.",
    ), ""),
    ("CAT-INLINE-NO-ID", _CAT, "rule", (
        "An inline declaration has no type_id and cannot be referenced.",
    ), ""),
    ("CAT-KINDLESS", _CAT, "rule", (
        "A StructTypeProto with no kind remains an unconstrained category only inside TypeProto; it is never a "
        "declaration or encoded layout.",
        "An unset-kind StructTypeProto is an unconstrained category, permitted only inside TypeProto for "
        "heterogeneous sequence/map elements, never as a payload layout.",
    ), ""),
    ("CAT-DECL-CONCRETE", _WIRE, "rule", (
        "a concrete declaration selects array, bit_packing or structure,",
    ), ""),
    ("INIT-NAMES-UNIQUE", _CAT, "rule", (
        "GraphProto.encoded_initializer names graph constants. Names are unique across dense, sparse and "
        "encoded initializers",
    ), ""),
    ("INIT-AS-INPUT", _CAT, "permission", (
        "and may also appear in graph inputs.",
    ), ""),
    ("GRAPH-STRUCT-IO", _CAT, "rule", (
        "A structured graph input or output uses TypeProto.struct_type;",
    ), ""),
    ("GRAPH-TENSOR-OPS", _CAT, "rule", (
        "tensor-only operators do not accept it without an explicit decoder or registered consumer.",
    ), ""),
    # --- Payload and lifetime -------------------------------------------------------------------------
    ("PAY-EXCLUSIVE", _PAY, "rule", ("raw_data and external_data are mutually exclusive.",), ""),
    ("PAY-EXTERNAL-KEYS", _PAY, "rule", (
        "data_location == EXTERNAL requires external_data with location and explicit length; offset is "
        "optional.",
    ), ""),
    ("PAY-DEFAULT-INLINE", _PAY, "rule", ("Default location uses raw_data.",), ""),
    ("PAY-EMPTY", _PAY, "rule", (
        "An empty inline payload represents zero records.",
        "an empty payload means zero records,",
    ), ""),
    ("PAY-VALIDATE-FIRST", _PAY, "rule", (
        "Payload bounds and layout are validated before any decoder or native callback runs.",
    ), ""),
    ("PAY-OWNER-TOKEN", _PAY, "native", (
        "Inline bytes are owned or borrowed with an owner token.",
    ), "Observable part: ZC-OUTSTANDING (values stay valid after the caller lets go)."),
    ("PAY-EXTERNAL-OWNER", _PAY, "rule", (
        "External mapped bytes retain their mapping owner.",
    ), "Observable as: an externally backed value retained by a state stays intact after the model and the "
       "caller's references are gone."),
    ("PAY-NO-POINTERS", _PAY, "rule", (
        "serialized records never contain pointers, native padding, vtables or process-local handles.",
    ), ""),
    ("PAY-OWNERLESS", _PAY, "rule", (
        "On the persistent execution path, an invocation-only ownerless borrow cannot become a returned output "
        "or retained state: the producer must supply a lifetime owner or transfer its allocation.",
        "invalid ownerless borrows",
    ), ""),
    ("PAY-UNSUPPORTED-OWNERSHIP", _PAY, "rule", (
        "Unsupported ownership is rejected explicitly, never repaired by a hidden payload copy.",
    ), ""),
    ("PAY-ARENA", _PAY, "rule", (
        "Arena storage must remain valid through a retained allocation/owner and cannot be recycled while "
        "referenced.",
        "arena reuse",
    ), ""),
    ("PAY-READ-ONLY", _PAY, "rule", ("Encoded inputs are read-only in the first implementation.",), ""),
    ("DEC-KEYED", _PAY, "rule", (
        "Native bindings are keyed by type_id and verify the resolved declaration before creating a typed view.",
    ), ""),
    ("DEC-INLINE-CODEC", _PAY, "rule", (
        "Inline custom layouts require generic field access or an explicit codec.",
    ), ""),
    ("DEC-MISSING", _PAY, "rule", ("Missing consumers fail explicitly;", "missing consumers"), ""),
    ("DEC-NO-LOAD-EXEC", _PAY, "rule", ("loading a model never executes codec code.",), ""),
    ("DEC-OUTSIDE-PROTO", _PAY, "size", (
        "Format-specific bindings and codecs stay outside lib_onnx_proto.",
        "The proto target contains only compact messages and serialization machinery; format-specific "
        "validators, codecs, catalogues and registration tables stay optional runtime dependencies.",
    ), ""),
    ("ENC-STRUCT-LAYOUT", _PAY, "rule", (
        "EncodedValueProto.struct_type selects an exact type_ref or a concrete inline declaration eligible for "
        "byte encoding; a reference may also appear inside TypeProto and nested fields.",
    ), ""),
    # --- Struct declarations --------------------------------------------------------------------------
    ("DECL-FIELD-CONTENT", _WIRE, "rule", (
        "each field selects either a value type or a tensor constant.",
    ), ""),
    ("DECL-TYPE-RULES", _PAY, "rule", (
        "Field.type and Array.element_type use TypeProto and its existing validation rules for tensors, nested "
        "structs, sequences, maps and optional values;",
    ), ""),
    ("DECL-DYNAMIC-DIMS", _PAY, "permission", ("tensor dimensions may be dynamic when permitted,",), ""),
    ("DECL-COUNTS-CONCRETE", _PAY, "rule", (
        "array lengths and bit-packing counts stay explicit concrete integers.",
    ), ""),
    ("DECL-CONSTANT", _PAY, "rule", (
        "Field.constant is the actual TensorProto value, not a graph input, and must have concrete dimensions "
        "and matching data.",
    ), ""),
    ("DECL-WELLFORMED", _ENC, "rule", (
        "Type checking rejects malformed declarations (structural, naming, type and count errors)",
        "with malformed-declaration and byte-encoding validation exercised through representative cases.",
    ), ""),
    ("DECL-DEPTH", _CAT, "limit", (), (
        "Not a spec statement: an implementation limit onnx-light shares. Type nesting, counting every type_ref "
        "expansion, is bounded (64 levels), so recursive resolution of a hostile catalogue stays bounded.")),
    ("RESOURCE-LIMITS", _ENC, "limit", (), (
        "Not a spec statement: bounds the oracle (like any runtime) needs against hostile input, each refused "
        "with RESOURCE_LIMIT before anything is allocated: decoded bytes, layout expansion, declared type nodes, "
        "shapes NumPy cannot hold (values in docs/security.md); cases that rely on them are Recommended.")),
    # --- Byte encoding --------------------------------------------------------------------------------
    ("ENC-SIZE-TABLE", _ENC, "rule", (
        "For a byte-encodable struct, compute sizes recursively in bits with checked uint64 arithmetic:",
        "size(Field(constant))       = 0",
    ), "Every row of the size table: scalars, tensors, arrays, bit packings, constants, structures, type_ref."),
    ("ENC-OVERFLOW", _ENC, "rule", ("overflowing size arithmetic;",), ""),
    ("ENC-FIXED-SIZE", _PAY, "rule", (
        "For byte encoding, every non-constant field must resolve recursively to fixed-size inline data; such a "
        "struct remains a valid runtime type but cannot select the raw/external byte-payload layout.",
        "non-fixed-size fields,",
    ), ""),
    ("ENC-LEAVES", _ENC, "rule", (
        "Only fixed-width ONNX scalar leaves are physical data, and every read is bounds-checked.",
        "unsupported leaves",
    ), ""),
    ("ENC-ROOT-SIZE", _ENC, "rule", ("the encoded root must have strictly positive size divisible by eight.",), ""),
    ("ENC-CONSTANT-ONLY", _ENC, "rule", (
        "Constant-only structs are valid types but cannot be encoding roots, though nested constant-only groups "
        "may contribute zero bytes.",
    ), ""),
    ("ENC-TIGHT", _ENC, "rule", (
        "Arrays and bit packings are tight, fields follow declaration order, and padding is explicit;",
        "Records are stored densely in buffer order; layouts needing internal strides or padding express them "
        "in the fixed element structure.",
    ), ""),
    ("ENC-BIT-ORDER", _ENC, "rule", ("bits run least-to-most-significant, multi-byte values little-endian.",), ""),
    ("DEC-ROOT-ONLY", _ENC, "rule", (
        "Only the concrete root’s decoder or encoder is invoked; a nested type_ref contributes layout and "
        "constants but not its own decoder/encoder.",
        "the root decoder reads the subtype’s codebook and each record’s scale and indices, without invoking a "
        "subtype decoder:",
    ), ""),
    ("ENC-RECORD-COUNT", _MANY, "rule", (
        "require(element_bytes > 0)",
        "require(payload_bytes % element_bytes == 0)",
        "partial records are rejected.",
    ), ""),
    ("ENC-NO-COUNT-IN-TYPE", _MANY, "rule", (
        "Payload byte length and resolved element size determine the record count; no physical shape or "
        "redundant count is serialized, and a different count does not create a new type.",
    ), ""),
    ("ENC-NO-IMPLICIT-TENSOR", _MANY, "rule", (
        "A byte length never lets a tensor-only operator accept encoded bytes implicitly.",
    ), ""),
    ("DEC-DEFINES-MAPPING", _MANY, "permission", (
        "the registered decoder defines signed-code scaling and the block-to-logical-element mapping,",
    ), "Cases that pin one element order for a registered decoder test that decoder, not the contract: they "
       "are Recommended unless the spec fixes the order (the codebook example does)."),
    ("ENC-UNALIGNED", _QEX, "rule", (
        "The INT64 at byte offset 68 is not necessarily aligned, so typed readers must handle it.",
    ), ""),
    ("EX-LINEAR-INT4", _QEX, "rule", (
        "each payload is exactly 128 * 4 / 8 = 64 bytes; decoding applies (code - (-2)) * 0.25,",
        "the decoder reads each value’s own parameters and applies (code - zero_point) * scale, so changing "
        "those values leaves the layout and type ID unchanged.",
    ), ""),
    ("EX-CODEBOOK", _CB, "rule", (
        "E4 packs indices 0, 1, 2, 3 in least-significant-bit order and 00 00 00 40 encodes FLOAT 2.0.",
        "The codebook lives once in type 1101’s constant field and contributes no payload bytes.",
        "The first value decodes to [-2.0, -0.5, 0.5, 2.0] repeated eight times; the second flattens 128 "
        "decoded blocks in storage order.",
    ), ""),
    # --- Payload extents ------------------------------------------------------------------------------
    ("PAY-EXTERNAL-EXTENT", _MANY, "rule", (
        "External data must supply an explicit length and a valid backing-file extent.",
    ), ""),
    ("PAY-EXTERNAL-CONTAINED", _MANY, "limit", (), (
        "Not a spec statement: the ONNX external-data convention the suite follows for safety. A location is "
        "relative to the model directory and may not be absolute or escape it (through '..' or symbolic "
        "links); cases for it are Recommended.")),
    # --- Size gate ------------------------------------------------------------------------------------
    ("SIZE-BASELINE", _SIZE, "size", (
        "The canonical PR01 baseline is the installed library from Linux core CI run 34234846380 at commit "
        "f450bbbda903a94cce0bce1eff7fba94097190f5.",
        "record the proto-size baseline and budget before PR02.",
    ), ""),
    ("SIZE-PR02-ALLOWANCE", _SIZE, "size", (
        "PR02 may add at most 128 KiB of stripped size, 96 KiB of .text and 64 dynamic symbols, while adding no "
        "shared-library dependency.",
        "Its installed-size ceiling of 1,193,944 bytes is stricter than the existing 1.2 MiB project ceiling.",
        "The table’s maxima were the absolute CI gates for PR02.",
    ), ""),
    ("SIZE-ORT-ALLOWANCE", _SIZE, "size", (
        "The subsequent native ORT reader/writer adds a separate, bounded allowance documented in ORT "
        "flatbuffer format: parallelization and alignment; it does not expand the PR02 representation "
        "allowance.",
    ), ""),
    ("SIZE-SIDE-BY-SIDE", _SIZE, "size", (
        "PR02 also reports a baseline and candidate built side by side with the same workflow to verify the "
        "deltas.",
    ), ""),
    ("SIZE-TOOLCHAIN", _SIZE, "process", (
        "A runner toolchain update refreshes the reference baseline in a separate PR, not as part of a "
        "representation change.",
    ), ""),
    ("SIZE-PR04-ALLOWANCE", _SEQ, "size", (
        "Relative to the post-ORT limits, PR04 receives a bounded allowance of 32 KiB installed, 16 KiB of .text "
        "and eight symbols, setting the corresponding CI limits to 1,423,320 bytes, 970,090 bytes and 800 "
        "symbols.",
        "The shared-library dependency allowlist remains unchanged.",
    ), ""),
    # --- Persistent bindings --------------------------------------------------------------------------
    ("BIND-GRAPH-LEVEL", _DECL, "rule", (
        "Add persistent_bindings to GraphProto, not a persistent flag to StructTypeProto or EncodedValueProto.",
        "The graph binding selects a whole value, with no persistent flag on the shared struct type or encoded "
        "value.",
    ), ""),
    ("BIND-SHARED-TYPE", _DECL, "rule", (
        "A type can describe both persistent and temporary values;",
        "Two values sharing one struct type can have different persistence bindings.",
    ), ""),
    ("BIND-EXACT-NAMES", _DECL, "rule", (
        "Names identify exact whole inputs and outputs of the declaring graph.",
        "unknown exact names",
    ), ""),
    ("BIND-LITERAL-NAMES", _DECL, "rule", (
        "Dots and backslashes in names are literal characters.",
        "distinguish dotted names from nested fields",
    ), ""),
    ("BIND-WHOLE", _DECL, "rule", (
        "An input is entirely persistent or not persistent; partial field selection is unsupported.",
    ), ""),
    ("BIND-STATELESS-DEFAULT", _DECL, "rule", ("No bindings means ordinary stateless execution.",), ""),
    ("BIND-ROOT-ONLY", _DECL, "rule", (
        "The initial runtime scope is the model’s root graph; persistent bindings in control-flow subgraphs are "
        "rejected explicitly until scoped state is supported.",
        "Reject unsupported nested-graph declarations",
    ), ""),
    ("BIND-NO-CONTENTS", _DECL, "rule", (
        "The declaration contains neither current cache contents nor native ownership handles.",
        "PersistentBindingProto declares only the graph relationship, not a second value/type system or hidden "
        "kernel state.",
    ), "Observable as: a binding carrying anything but the two names (such as the legacy field-selection tags) "
       "is not read as a plain binding, and a state keeps no hidden values beyond its bound inputs."),
    ("BIND-COMPATIBLE", _MIN, "rule", (
        "Every selected graph input/output must exist with compatible types, representation contracts and shape "
        "constraints.",
        "incompatible types/shapes",
    ), ""),
    ("BIND-NO-STRINGS", _MIN, "rule", (
        "String tensors cannot be persistent, including nested tensor fields and constants in selected whole "
        "structures or encoded layouts.",
        "The shared declaration validator follows catalogue references recursively,",
    ), ""),
    ("BIND-DUPLICATES", _MIN, "rule", ("duplicate input/output selections,",), ""),
    ("EXP-VALIDATE-FINAL", _GB, "rule", (
        "Validate bindings against the final graph before constructing a session.",
    ), ""),
    # --- State ----------------------------------------------------------------------------------------
    ("STATE-NO-MODEL-SCAN", _DECL, "rule", (
        "Retaining and forwarding state buffers requires no payload copy or model serialization.",
        "It is serialized only during explicit model save/load, not during state construction or execution.",
        "State construction and subsequent calls must not serialize, clone, hash or repeatedly compare the model "
        "to detect mutation.",
        "Large-model fixtures verify that constructing and running state performs no model serialization, "
        "cloning or mutation-detection scan.",
    ), ""),
    ("STATE-RESOLVE-ONCE", _DECL, "rule", (
        "make_state resolves the model’s bindings and types once, after graph rewrites.",
        "Resolve the declarations once;",
        "Resolve graph bindings once against an immutable model.",
    ), ""),
    ("STATE-INITIAL", _DECL, "rule", (
        "Initial contents must still be supplied.",
        "missing initial values,",
    ), ""),
    ("STATE-MODEL-OWNER", _DECL, "internal", (
        "Native callers keep it alive; Python bindings retain its owner.",
    ), "Observable as: a state keeps working after the caller drops every reference to the model it was made "
       "from."),
    ("STATE-WHOLE-STRUCT", _WHOLE, "rule", ("The same mapping can retain an entire structured input.",), ""),
    ("STATE-UNSELECTED", _WHOLE, "rule", (
        "Fresh values belong to separate graph inputs.",
        "The whole cache input persists: tokens are supplied anew and logits are separate outputs, not retained.",
        "verifying that separate unselected outputs are not retained",
    ), ""),
    ("STATE-VALIDATE-METADATA", _MIN, "rule", (
        "validate actual value metadata before publication without copying or serializing payloads.",
        "runtime retention rejects incompatible actual values rather than copying them.",
    ), ""),
    ("STATE-FEEDS", _MIN, "rule", (
        "Every required whole input comes from current feeds or retained state;",
    ), ""),
    ("STATE-FEED-OVERRIDE", _MIN, "rule", ("current feeds overriding retained inputs are errors.",), ""),
    ("STATE-ATOMIC", _MIN, "rule", (
        "Retained values update only after successful execution and validation;",
        "A retained state update becomes visible atomically only after execution and validation succeed.",
        "Build and validate the next state’s owner handles before publishing them atomically.",
    ), ""),
    ("STATE-ISOLATION", _MIN, "rule", (
        "each request owns its state bindings,",
        "Per-request state containers are separate; shared buffers do not imply permission to mutate another "
        "request’s data.",
        "simultaneous independent feedback states",
    ), ""),
    ("STATE-NO-CONCURRENCY", _MIN, "rule", ("simultaneous calls on the same state are rejected.",), ""),
    ("STATE-RESET", _MIN, "rule", ("reset(initial) restores caller-supplied initial values;",), ""),
    ("STATE-CLOSE", _MIN, "rule", ("close releases retained values,",), ""),
    ("STATE-NO-RACE", _MIN, "rule", (
        "and neither may race with an active call.",
        "Reset or close cannot race with a call.",
    ), "Rejecting the reset or close and waiting for the active call both satisfy it; only racing fails."),
    # --- Zero-copy ------------------------------------------------------------------------------------
    ("ZC-RETAIN", _ZC, "rule", (
        "PR04 must retain/share/move existing backing storage for initialization, reset, per-call feeds, "
        "selected outputs and next-call inputs.",
        "Assignment retains or moves buffer owners rather than copying payloads.",
        "the next call receives the same backing buffers as the previous selected outputs.",
    ), ""),
    ("ZC-NO-PAYLOAD-COPY", _ZC, "rule", (
        "Copying small metadata, shape descriptors or owner handles is allowed; copying tensor or encoded "
        "payload bytes for state management is not.",
        "PR04b acceptance requires zero payload-copy bytes attributable to state management and no model "
        "serialization, both during setup and repeated calls.",
    ), ""),
    ("ZC-VIEWS", _ZC, "rule", (
        "State-value access returns lifetime-safe shared views, not implicit deep-copy snapshots.",
    ), ""),
    ("ZC-ENTRY-POINTS", _ZC, "rule", (
        "NumPy and PyTorch entry points must likewise retain supported source buffers without materializing "
        "payload copies, or report unsupported layouts/ownership explicitly.",
    ), "Zero-copy retention and a clean unsupported rejection both pass; only a silent copy fails."),
    ("ZC-STRINGS-NONPERSISTENT", _ZC, "permission", (
        "Ordinary nonpersistent string feeds and outputs remain supported with their normal materialized "
        "representation; they are not part of retained state.",
    ), ""),
    ("ZC-SHARED-STORAGE", _ZC, "permission", (
        "Returned outputs and retained state may share storage.",
        "Kernels may compute new outputs normally;",
    ), ""),
    ("ZC-OUTSTANDING", _ZC, "rule", (
        "Releasing caller references, resetting/closing a state or advancing another invocation must not "
        "invalidate an outstanding view.",
        "Exercise caller destruction, outstanding outputs after close,",
    ), ""),
    ("ZC-TRANSPORT", _ZC, "rule", (
        "Functions, If and structured field transport must preserve these owners rather than call deep-copy or "
        "serialization-based detachment helpers.",
        "Passing state values through stateless functions and subgraphs remains supported.",
    ), ""),
    ("ZC-READ-ONLY", _ZC, "rule", (
        "Callers and kernels must treat these buffers as read-only while shared or retained.",
    ), "Required: the runtime never writes a buffer still referenced. Handing out non-writable views is a "
       "Recommended way to enforce it."),
    ("ZC-NO-INPLACE", _ZC, "rule", (
        "It must not silently enable in-place reuse of an allocation still referenced by the previous state or a "
        "returned output.",
    ), ""),
    ("ZC-FAILURE", _ZC, "rule", (
        "Failure or cancellation leaves the previous state and its buffers valid; it must not require a backup "
        "copy.",
    ), ""),
    ("ZC-NO-DUPLICATE", _ZC, "rule", (
        "PR04 must not duplicate those outputs merely to retain or return them.",
    ), ""),
    ("ZC-EXACT-OUTPUTS", _ZC, "rule", (
        "The runtime selects exact whole output names at ownership boundaries; it does not enable a context-wide "
        "persistence mode or replace kernel dispatch.",
    ), ""),
    ("ZC-NATIVE-MOVE", _ZC, "native", (
        "C++ owned initial maps are transferred explicitly with std::move; const views never promote or move "
        "their source storage.",
    ), ""),
    # --- KV caches ------------------------------------------------------------------------------------
    ("KV-PAGED-FORMATS", _PAGED, "rule", (
        "This changes its fields and representations, not its persistence mechanism:",
        "Each K/V block may use a different EncodedValueProto layout, such as INT4, INT8 or a codebook struct, "
        "provided its decoded type and geometry satisfy the consumer contract.",
        "The shared EncodedValueProto representation supports different K/V and per-block formats.",
    ), ""),
    ("KV-PAGED-RANGE", _PAGED, "rule", (
        "The block’s logical token range and valid length are value data; payload byte length measures physical "
        "records, not valid tokens.",
    ), ""),
    ("KV-BOUNDED", _PAGED, "rule", (
        "acceptance measures bounded workspace and no full-cache copy or dequantization.",
        "Blockwise append/conversion and Attention preserve validity and bounded workspace without copying or "
        "dequantizing the entire cache.",
    ), ""),
    ("KV-APPEND-INPLACE", _SEQ, "rule", (
        "Optimize past/present inputs when ownership permits buffer reuse: append touches only new tokens",
    ), "In-place append is conditional: when ownership permits."),
    ("KV-APPEND-EQUIV", _SEQ, "rule", ("matches functional execution.",), ""),
    ("KV-CAPACITY-REUSE", _OWN, "rule", (
        "PR05 must further demonstrate fixed-capacity reuse before claiming no algorithmic full-cache allocation "
        "or copy.",
    ), ""),
    ("KV-CAPACITY-INVALID", _OWN, "rule", ("invalid capacities",), ""),
    ("KV-MUTATION-FAILED", _SEQ, "rule", (
        "Verify capacity/cancellation and allocation/copy costs without invalidating prior returned views.",
        "failed mutations.",
    ), ""),
    ("KV-ATTENTION", _SEQ, "rule", (
        "repeated Attention decode comparison",
    ), "Attention over the cache matches the functional (dense) computation."),
    # --- GraphBuilder and export ----------------------------------------------------------------------
    ("EXP-PRESERVE-STRUCT", _GB, "rule", (
        "GraphBuilder preserves structured source initializers, type references, byte extents, external "
        "payload ownership and quantization metadata through import/export.",
    ), ""),
    ("EXP-DEDUP", _GB, "rule", (
        "Deduplication considers semantic profiles, not just payload bytes.",
    ), "Observable as: two values with equal bytes but different layouts or parameters both survive an "
       "optimizing rewrite and decode differently."),
    ("EXP-PRESERVE", _GB, "rule", (
        "It must also author and preserve GraphProto.persistent_bindings through import/export, graph copying, "
        "renaming and optimization.",
    ), ""),
    ("EXP-RENAME", _GB, "rule", ("Renaming an input/output updates its binding;",), ""),
    ("EXP-REWRITE", _GB, "rule", (
        "a rewrite removing or changing a selected input/output must update the declaration consistently or "
        "fail, never silently drop it.",
    ), "An explicit unbinding is not a silent drop."),
    ("EXP-STRUCT", _GB, "rule", (
        "General struct declarations round-trip through the type catalogue too; unsupported field-value export "
        "fails explicitly rather than dropping dynamic fields.",
        "Standard export never loses data: unsupported structured constructs are rejected explicitly.",
    ), ""),
    ("EXP-STANDARD", _GB, "rule", (
        "Standard ONNX export must reject persistence declarations unless an explicit lowering to a stateless "
        "graph and caller-managed feedback preserves the contract.",
        "Silently stripping the attribute is not a valid stateful export.",
        "and standard export that would drop persistence semantics.",
    ), ""),
    # --- Process and measurement statements (not observable through a runtime) ------------------------
    ("PROC-MEASURE", _OWN, "process", (
        "Measure repeated decode and simultaneous independent feedback states; report state/scratch bytes and "
        "per-token copies, and verify request reset/isolation and the final proto-size budget.",
        "Measure pointer identity and payload-copy/allocation counters across initialization, repeated calls, "
        "reset and state-view access, including NumPy/PyTorch entry points, encoded values and function/If "
        "transport.",
        "Kernel computation and explicit model save/load are measured separately, not hidden inside "
        "state-management overhead.",
        "Performance reports include latency, peak/resident bytes and copy/read counters, distinguishing "
        "decoding, inference and state-management cost.",
    ), "The benchmarks (benchmarks/) report these figures; their rules are the clauses they measure."),
    ("PROC-NO-SECOND-STATE", _OWN, "process", (
        "onnx-light-cpu supplies format validators, typed consumers, KV append and Attention, without creating "
        "another persistent-state manager or private executor.",
    ), "An architecture statement about onnx-light's packages."),
]

CLAUSES: dict[str, Clause] = {cid: Clause(cid, section, kind, quotes, note)
                              for cid, section, kind, quotes, note in _CLAUSES}

#: Sentences of the spec that use normative words but state no requirement of their own, with the reason;
#: ``tests/test_clauses.py`` needs every other normative sentence to overlap some clause quote.
INFORMATIVE: dict[str, str] = {
    "Covers three uses of values": "scope",
    "Proto schema inheritance is independent and not a prerequisite.": "scope",
    "Prepacking, prepared-object identity": "scope: owned by another design",
    "Common quantization (INT8 per-tensor/per-axis, INT4 blockwise affine) selects the built-in affine layout":
        "overview of AFF-* and ENC-STRUCT-LAYOUT",
    "EncodedValueProto replaces the separate StructProto": "history",
    "Affine layout parameters are a small nested descriptor": "overview",
    "StructTypeProto describes a struct’s fields and types": "overview of CAT-DECL-CONCRETE, DECL-FIELD-CONTENT",
    "In the byte-encodable subset, StructTypeProto defines one encoded element": "overview of ENC-RECORD-COUNT",
    "This is descriptive syntax, not the final wire schema.": "notation",
    "Each physical element holds 16 bytes of INT4 codes": "example layout (DEC-DEFINES-MAPPING)",
    "For the structured branch, require:": "introduces ENC-RECORD-COUNT",
    "The two buffers above thus contain": "worked example of ENC-RECORD-COUNT and PAY-EMPTY",
    "For type 1003, both constants are serialized once": "worked example (EX-LINEAR-INT4, CAT-ID-CHANGE)",
    "For type 1002, both payloads occupy": "worked example (EX-LINEAR-INT4)",
    "Other parent types may reuse subtype 1101": "worked example (CAT-ID-CHANGE)",
    "This is composition by reference, not inheritance": "example",
    "Report only": "size table cell",
    "No additions": "size table cell (SIZE-PR02-ALLOWANCE)",
    "this plan does not define prepack requests": "scope",
    "A boolean also cannot identify the output that supplies the next value.": "rationale for BIND-GRAPH-LEVEL",
    "an input can be an ordinary tensor or a whole structure without an encoded payload.":
        "overview of STATE-WHOLE-STRUCT",
    "These examples are conceptual API sketches.": "notation",
    "To change the graph, close the state and create a new session after rewriting.":
        "advice following STATE-MODEL-IMMUTABLE",
    "Tensor above only abbreviates the model’s actual tensor types and shape constraints.": "notation",
    "PR04 does not promise independent mutable snapshots or rollback of external writes.":
        "scope (ZC-READ-ONLY)",
    "Persistence implies neither mutation nor disk storage.": "scope",
    "This ownership requirement is distinct from PR05’s in-place KV append and capacity management.": "scope",
    "RuntimeValue only supplies the recursive struct/encoded representation absent from Tensor.":
        "native design note",
    "Avoiding algorithmic full-cache reconstruction, paging, explicit snapshots": "scope",
    "Paging, block conversion and zero-copy Attention are optional consumer optimizations":
        "scope: the kv-paged profile is optional (KV-BOUNDED holds where it is claimed)",
    "ShapesContext stays the single source of truth": "native design note",
    "In-place KV mutation and alias annotations remain later work.": "scope",
    "Zero-copy state forwarding is already required by PR04b; this step optimizes kernel writes.": "scope",
    "Freeze the built-in affine subset": "history (SIZE-BASELINE)",
    "Implement StructTypeProto and the structured branch of EncodedValueProto first": "history",
    "Structured initializers, logical/physical inference, scope-aware references and deduplication agree.":
        "overview of EXP-PRESERVE-STRUCT and EXP-DEDUP",
    "Add PersistentBindingProto and GraphProto.persistent_bindings;": "history (WIRE-BINDINGS-FIELD)",
    "Retain buffers across initialization, reset, calls and state views": "restates ZC-RETAIN",
    "Verify aliases, lifetimes, atomic failure/cancellation and pointer identity": "restates ZC-* acceptance",
    "PR04 is split into the wire/GraphBuilder declaration": "history",
    "Basic feedback does not depend on quantization format or paging.": "scope",
    "PR06 was optional and did not block PR07.": "history",
    "Later work can extend the same graph-declared feedback contract": "scope",
    "onnx-light owns type/serialization contracts": "ownership",
    "Acceptance uses C++ fixtures and existing runtime/backend test infrastructure": "introduces acceptance",
    "State fixtures retain whole tensors and whole structured cache inputs": "restates STATE-WHOLE-STRUCT",
    "Wire/GraphBuilder fixtures round-trip bindings": "restates EXP-PRESERVE, BIND-* acceptance",
    "PR01 and PR02 are complete": "history",
    "PR #5016 implements the PR04a declaration": "history",
    "The Linux Release measurement for this implementation": "measurement (SIZE-PR04-ALLOWANCE)",
    "PR #5070 completes PR07": "history",
    "The 2026-09-20 revision adds a graph-level persistence declaration": "history",
    "Graph-declared persistent bindings now retain outputs across calls": "history",
    "The implementation sequence below records the completed design": "history",
    "The job uses Ubuntu 24.04 x86-64": "baseline environment (SIZE-BASELINE)",
    "Three quantities are involved": "overview",
    "The notation below abbreviates": "notation",
    "A subtype describes 32 two-bit indices": "example",
    "Resolution follows 1102 -> quantized.type -> 1101;": "worked example of DEC-ROOT-ONLY",
    "A cache can contain a sequence of blocks instead of contiguous K/V tensors.": "overview of KV-PAGED",
    "State is simply model outputs retained to supply some inputs of the next call.": "overview",
    "The caller supplies initial values and per-call feeds": "overview of STATE-INITIAL",
    "The retained values constitute the request-local state;": "overview",
    "The whole cache input persists": "example (STATE-UNSELECTED)",
    "The model describes both their types and their output-to-input bindings.": "overview",
    "These are ordinary structs described by StructTypeProto:": "overview",
    "EncodedValueProto may describe the bytes and logical view of an object": "scope",
    "A quantized value can use a conventional block layout or a custom structure": "overview",
    "Logical meaning, physical representation and lifetime stay independent:": "overview",
    "PR02 also reports a baseline and candidate": "SIZE-SIDE-BY-SIDE",
}
