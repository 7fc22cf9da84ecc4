"""One exception type with stable error codes, each tied to the clause it enforces.

Codes are part of the suite's public interface: conformance cases expect them and vendors map their
own errors to them. Never rename or reuse a code; add new ones.
"""

from __future__ import annotations

import enum


class ErrorCode(str, enum.Enum):
    """Stable error codes. The value is the code string; ``clause`` names the spec clause."""

    def __new__(cls, value: str, clause: str, summary: str):
        member = str.__new__(cls, value)
        member._value_ = value
        member.clause = clause
        member.summary = summary
        return member

    # Input and limits
    MODEL_PARSE_ERROR = ("MODEL_PARSE_ERROR", "WIRE-FIELDS", "bytes are not a parseable ModelProto")
    NESTING_TOO_DEEP = ("NESTING_TOO_DEEP", "DECL-DEPTH",
                        "types (through references), values or graph bodies nest deeper than 64 levels")
    RESOURCE_LIMIT = ("RESOURCE_LIMIT", "RESOURCE-LIMITS",
                      "an implementation limit is exceeded: decoded bytes, layout expansion, declared type "
                      "nodes or a shape NumPy cannot hold (docs/security.md)")
    # Catalogue and identity
    TYPE_ID_MISSING = ("TYPE_ID_MISSING", "CAT-ID-NONZERO", "catalogue declaration has no type_id")
    TYPE_ID_ZERO = ("TYPE_ID_ZERO", "CAT-ID-NONZERO", "type_id is zero")
    TYPE_ID_DUPLICATE = ("TYPE_ID_DUPLICATE", "CAT-ID-UNIQUE", "two declarations share a type_id")
    DECLARATION_NOT_CONCRETE = ("DECLARATION_NOT_CONCRETE", "CAT-DECL-CONCRETE",
                                "catalogue declaration is a type_ref instead of a concrete kind")
    KINDLESS_MISPLACED = ("KINDLESS_MISPLACED", "CAT-KINDLESS",
                          "kind-less StructTypeProto used as a declaration or layout")
    TYPE_REF_UNRESOLVED = ("TYPE_REF_UNRESOLVED", "CAT-REF-RESOLVED",
                           "type_ref names no catalogue declaration")
    TYPE_REF_CYCLE = ("TYPE_REF_CYCLE", "CAT-REF-ACYCLIC", "type references form a cycle")
    TYPE_REF_EXTRA_FIELDS = ("TYPE_REF_EXTRA_FIELDS", "CAT-REF-ONLY-ID",
                             "type_ref carries fields besides the ID")
    INLINE_TYPE_ID = ("INLINE_TYPE_ID", "CAT-INLINE-NO-ID", "inline declaration carries a type_id")
    # Declarations
    STRUCTURE_EMPTY = ("STRUCTURE_EMPTY", "DECL-WELLFORMED", "structure has no fields")
    BIT_PACKING_EMPTY = ("BIT_PACKING_EMPTY", "DECL-WELLFORMED", "bit packing has no components")
    NAME_EMPTY = ("NAME_EMPTY", "DECL-WELLFORMED", "field or component name is empty")
    NAME_DUPLICATE = ("NAME_DUPLICATE", "DECL-WELLFORMED", "field or component name repeats")
    FIELD_CONTENT_MISSING = ("FIELD_CONTENT_MISSING", "DECL-FIELD-CONTENT",
                             "field has neither a type nor a constant")
    BIT_WIDTH_INVALID = ("BIT_WIDTH_INVALID", "DECL-WELLFORMED", "bit width outside 1..64")
    DIMENSION_INVALID = ("DIMENSION_INVALID", "DECL-COUNTS-CONCRETE",
                         "array or bit-packing dimension missing or zero")
    ARRAY_ELEMENT_MISSING = ("ARRAY_ELEMENT_MISSING", "DECL-WELLFORMED", "array has no element_type")
    TYPE_INVALID = ("TYPE_INVALID", "DECL-TYPE-RULES", "TypeProto violates its validation rules")
    CONSTANT_DIMS_INVALID = ("CONSTANT_DIMS_INVALID", "DECL-CONSTANT",
                             "constant has negative (non-concrete) dimensions")
    TENSOR_DATA_INVALID = ("TENSOR_DATA_INVALID", "DECL-CONSTANT",
                           "tensor data does not match its type and dimensions")
    # Byte encoding
    SIZE_OVERFLOW = ("SIZE_OVERFLOW", "ENC-OVERFLOW", "size arithmetic overflows uint64")
    NOT_FIXED_SIZE = ("NOT_FIXED_SIZE", "ENC-FIXED-SIZE", "a non-constant field is not fixed-size")
    UNSUPPORTED_LEAF = ("UNSUPPORTED_LEAF", "ENC-LEAVES",
                        "leaf element type is not a fixed-width scalar")
    ROOT_SIZE_ZERO = ("ROOT_SIZE_ZERO", "ENC-CONSTANT-ONLY", "encoding root has zero size")
    ROOT_SIZE_NOT_BYTES = ("ROOT_SIZE_NOT_BYTES", "ENC-ROOT-SIZE",
                           "encoding root size is not a multiple of eight bits")
    # Encoded values and payloads
    LAYOUT_MISSING = ("LAYOUT_MISSING", "ENC-LAYOUT", "encoded value selects no layout")
    PAYLOAD_BOTH = ("PAYLOAD_BOTH", "PAY-EXCLUSIVE", "raw_data and external_data both present")
    PAYLOAD_LOCATION_MISMATCH = ("PAYLOAD_LOCATION_MISMATCH", "PAY-EXTERNAL-KEYS",
                                 "external_data without data_location EXTERNAL, or an unknown location")
    EXTERNAL_LOCATION_MISSING = ("EXTERNAL_LOCATION_MISSING", "PAY-EXTERNAL-KEYS",
                                 "external payload has no location")
    EXTERNAL_LENGTH_MISSING = ("EXTERNAL_LENGTH_MISSING", "PAY-EXTERNAL-KEYS",
                               "external payload has no explicit length")
    EXTERNAL_KEY_INVALID = ("EXTERNAL_KEY_INVALID", "PAY-EXTERNAL-KEYS",
                            "external_data key unknown or repeated")
    EXTERNAL_NUMBER_INVALID = ("EXTERNAL_NUMBER_INVALID", "PAY-EXTERNAL-KEYS",
                               "offset or length is not a decimal uint64")
    EXTERNAL_EXTENT_OVERFLOW = ("EXTERNAL_EXTENT_OVERFLOW", "PAY-EXTERNAL-EXTENT",
                                "offset + length overflows uint64")
    EXTERNAL_PATH_INVALID = ("EXTERNAL_PATH_INVALID", "PAY-EXTERNAL-CONTAINED",
                             "location is absolute or escapes the model directory")
    EXTERNAL_FILE_INVALID = ("EXTERNAL_FILE_INVALID", "PAY-EXTERNAL-EXTENT",
                             "backing file missing or shorter than offset + length")
    PAYLOAD_PARTIAL_RECORD = ("PAYLOAD_PARTIAL_RECORD", "ENC-RECORD-COUNT",
                              "payload length is not a whole number of records")
    LOGICAL_TYPE_INVALID = ("LOGICAL_TYPE_INVALID", "AFF-LOGICAL",
                            "logical_type missing, not a tensor, or not concrete")
    LOGICAL_SHAPE_MISMATCH = ("LOGICAL_SHAPE_MISMATCH", "ENC-LOGICAL-EXACT",
                              "decoded value differs from the declared logical type or shape")
    # Affine branch
    AFFINE_STORAGE_INVALID = ("AFFINE_STORAGE_INVALID", "AFF-STORAGE",
                              "storage_type outside INT8/UINT8/INT4/UINT4/INT2/UINT2")
    AFFINE_SCALE_INVALID = ("AFFINE_SCALE_INVALID", "AFF-SCALE",
                            "scale missing or not of a floating element type")
    AFFINE_PARAM_SHAPE = ("AFFINE_PARAM_SHAPE", "AFF-DQ",
                          "scale or zero_point shape does not fit the granularity")
    AFFINE_ZERO_POINT_INVALID = ("AFFINE_ZERO_POINT_INVALID", "AFF-ZERO-POINT",
                                 "zero_point element type differs from storage_type")
    AFFINE_AXIS_INVALID = ("AFFINE_AXIS_INVALID", "AFF-AXIS", "axis outside [-rank, rank)")
    AFFINE_BLOCK_WITHOUT_AXIS = ("AFFINE_BLOCK_WITHOUT_AXIS", "AFF-BLOCK",
                                 "block_size set without axis")
    AFFINE_BLOCK_INVALID = ("AFFINE_BLOCK_INVALID", "AFF-BLOCK", "block_size is zero")
    AFFINE_PAYLOAD_SIZE = ("AFFINE_PAYLOAD_SIZE", "AFF-PAYLOAD-SIZE",
                           "code payload is not exactly ceil(n * bits / 8) bytes")
    AFFINE_PADDING_NONZERO = ("AFFINE_PADDING_NONZERO", "AFF-PADDING-ZERO", "unused final high bits not zero")
    # Graph
    INITIALIZER_NAME_DUPLICATE = ("INITIALIZER_NAME_DUPLICATE", "INIT-NAMES-UNIQUE",
                                  "initializer name repeats across dense, sparse and encoded")
    INITIALIZER_NAME_EMPTY = ("INITIALIZER_NAME_EMPTY", "INIT-NAMES-UNIQUE",
                              "encoded initializer has no name")
    # Decoding and consumers
    VALUE_NOT_FOUND = ("VALUE_NOT_FOUND", "DEC-MISSING", "no encoded value of that name")
    CONSUMER_MISSING = ("CONSUMER_MISSING", "DEC-MISSING",
                        "no decoder or registered consumer for the value")
    DECODER_MISMATCH = ("DECODER_MISMATCH", "DEC-KEYED",
                        "registered decoder refuses the resolved declaration")
    FIELD_NOT_FOUND = ("FIELD_NOT_FOUND", "DEC-INLINE-CODEC", "record field path does not resolve")
    # Persistent bindings
    BINDING_NAME_UNKNOWN = ("BINDING_NAME_UNKNOWN", "BIND-EXACT-NAMES",
                            "binding names no whole input or output of the graph")
    BINDING_INPUT_DUPLICATE = ("BINDING_INPUT_DUPLICATE", "BIND-DUPLICATES",
                               "an input is selected by two bindings")
    BINDING_OUTPUT_DUPLICATE = ("BINDING_OUTPUT_DUPLICATE", "BIND-DUPLICATES",
                                "an output is selected by two bindings")
    BINDING_INCOMPATIBLE = ("BINDING_INCOMPATIBLE", "BIND-COMPATIBLE",
                            "bound input and output have incompatible types or shapes")
    BINDING_STRING = ("BINDING_STRING", "BIND-NO-STRINGS", "a persistent value contains a string tensor")
    BINDING_IN_SUBGRAPH = ("BINDING_IN_SUBGRAPH", "BIND-ROOT-ONLY",
                           "bindings declared in a control-flow subgraph or function")
    # State
    STATE_INITIAL_MISSING = ("STATE_INITIAL_MISSING", "STATE-INITIAL",
                             "initial values miss a bound input")
    STATE_INITIAL_UNKNOWN = ("STATE_INITIAL_UNKNOWN", "STATE-INITIAL",
                             "initial values name an input that is not bound")
    STATE_VALUE_INCOMPATIBLE = ("STATE_VALUE_INCOMPATIBLE", "STATE-VALIDATE-METADATA",
                                "a value does not match the declared type or shape")
    STATE_FEED_OVERRIDES = ("STATE_FEED_OVERRIDES", "STATE-FEED-OVERRIDE", "a feed overrides a retained input")
    STATE_FEED_MISSING = ("STATE_FEED_MISSING", "STATE-FEEDS", "a required input has no feed")
    STATE_FEED_UNKNOWN = ("STATE_FEED_UNKNOWN", "STATE-FEEDS", "a feed names no graph input")
    STATE_BUSY = ("STATE_BUSY", "STATE-NO-CONCURRENCY", "a call is already active on this state")
    STATE_CLOSED = ("STATE_CLOSED", "STATE-CLOSE", "the state is closed")
    STATE_UNRETAINABLE = ("STATE_UNRETAINABLE", "PAY-UNSUPPORTED-OWNERSHIP",
                          "a value cannot be retained without a copy")
    OWNERLESS_BORROW = ("OWNERLESS_BORROW", "PAY-OWNERLESS",
                        "an invocation-only or ownerless borrow would become an output or retained state")
    STATE_RUN_FAILED = ("STATE_RUN_FAILED", "STATE-ATOMIC", "execution failed; state unchanged")
    STATE_CANCELLED = ("STATE_CANCELLED", "ZC-FAILURE", "execution was cancelled; state unchanged")
    # Execution, export and rewrites
    EXECUTION_FAILED = ("EXECUTION_FAILED", "STATE-ATOMIC", "an operator failed")
    OPERATOR_UNSUPPORTED = ("OPERATOR_UNSUPPORTED", "DEC-MISSING",
                            "operator not supported by the reference executor")
    EXPORT_PERSISTENCE = ("EXPORT_PERSISTENCE", "EXP-STANDARD",
                          "standard export would drop persistent bindings")
    EXPORT_UNSUPPORTED = ("EXPORT_UNSUPPORTED", "EXP-STRUCT",
                          "standard export would drop structured values")
    REWRITE_NAME_CONFLICT = ("REWRITE_NAME_CONFLICT", "EXP-RENAME",
                             "a rename names a missing value or merges two values")
    REWRITE_DROPS_BINDING = ("REWRITE_DROPS_BINDING", "EXP-REWRITE",
                             "a rewrite removes or changes a bound input/output")
    # KV caches
    KV_CAPACITY_INVALID = ("KV_CAPACITY_INVALID", "KV-CAPACITY-INVALID", "capacity is not a positive integer")
    KV_CAPACITY_EXCEEDED = ("KV_CAPACITY_EXCEEDED", "KV-MUTATION-FAILED", "append exceeds a fixed capacity")
    KV_SHAPE_MISMATCH = ("KV_SHAPE_MISMATCH", "KV-APPEND-EQUIV", "new tokens do not fit the cache geometry")
    KV_BLOCK_INVALID = ("KV_BLOCK_INVALID", "KV-PAGED-RANGE",
                        "block table, token range or block format is invalid")
    ATTENTION_INPUT_INVALID = ("ATTENTION_INPUT_INVALID", "KV-ATTENTION",
                               "Attention inputs have incompatible shapes or attributes")


#: Codes a correct implementation reports because of its own limits, not because the spec forbids the input:
#: another conforming runtime may accept the same input, or stop earlier with the same code.
LIMIT_CODES = frozenset({ErrorCode.NESTING_TOO_DEEP, ErrorCode.RESOURCE_LIMIT})


class ContractError(Exception):
    """The one exception every rejection raises: a stable ``code`` and the ``path`` of the object."""

    def __init__(self, code: ErrorCode, path: str, message: str, causes: tuple[ErrorCode, ...] = ()):
        self.code = ErrorCode(code)
        self.path = path
        self.message = message
        #: the codes of the errors that made this one happen, innermost last (a failed run names why)
        self.causes = tuple(ErrorCode(c) for c in causes)
        super().__init__(f"[{self.code.value}] {path}: {message}")

    @property
    def clause(self) -> str:
        return self.code.clause


def violation(code: ErrorCode, path: str, message: str, causes: tuple[ErrorCode, ...] = ()) -> ContractError:
    """Build the error to raise; ``raise violation(...)`` reads as the rule being enforced."""
    return ContractError(code, path, message, causes)
