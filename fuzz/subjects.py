"""Implementations the differential target compares with the oracle, through the adapter protocol.

Any conformance adapter is a subject (``conformance.adapters.load_adapter``: a builtin name,
``module:attribute``, a file, or a subprocess testee command so that a crashing native testee only
kills its own process). ``observe`` runs the same operations on a subject and returns comparable
observations; ``compare`` lists the disagreements (verdict, error code, values beyond tolerance).

``FaultyReference`` is the reference adapter with exactly one injected fault, used to show that the
differential target finds a disagreement.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from fuzz.invariants import Finding, origin
from reference_impl.errors import LIMIT_CODES

#: Relative tolerance for floating outputs; integer outputs must be equal.
RTOL = float(os.environ.get("FUZZ_RTOL", "1e-6"))
ATOL = float(os.environ.get("FUZZ_ATOL", "0"))


@dataclass(frozen=True)
class Outcome:
    """One operation's result: accepted (with a value), rejected (with a code) or unsupported."""

    kind: str  # "ok" | "reject" | "unsupported"
    code: str | None = None
    value: Any = None
    causes: tuple[str, ...] = ()  # the codes a rejection names as its causes (Rejected.causes)

    def __str__(self) -> str:
        return {"ok": "accept", "reject": f"reject {self.code}"}.get(self.kind, "unsupported")


def _call(adapter, fn, *args) -> Outcome:
    from conformance.adapters import NotSupported, Rejected

    try:
        return Outcome("ok", value=fn(*args))
    except Rejected as rejected:
        return Outcome("reject", code=rejected.code, causes=tuple(rejected.causes))
    except NotSupported:
        return Outcome("unsupported")
    except Finding:
        raise
    except Exception as error:  # noqa: BLE001 - classify, or report as an unclassified exception
        if type(error).__name__ == "TesteeFailure":  # the subprocess crashed, hung or broke the protocol
            name = getattr(adapter, "name", adapter)
            raise Finding("testee-crash", f"{name}: {error}",
                          f"testee:{name}:{getattr(fn, '__name__', 'call')}") from None
        classify = getattr(adapter, "classify", None)
        mapped = classify(error) if classify else None
        if isinstance(mapped, Rejected):
            return Outcome("reject", code=mapped.code, causes=tuple(mapped.causes))
        if isinstance(mapped, NotSupported):
            return Outcome("unsupported")
        raise Finding("unclassified", f"{getattr(adapter, 'name', adapter)}: {type(error).__name__}: {error}",
                      origin(error.__traceback__)) from None


def end_case(adapter) -> None:
    """Release what ``adapter`` lent for the input just judged (a subprocess testee's ownerless answers are
    held until the case ends): without it a campaign's inputs pile them up until the per-case limit refuses
    an honest answer, a testee failure the subject never had."""
    release = getattr(adapter, "end_case", None)
    if callable(release):
        release()


def value_names(model_bytes: bytes) -> list[tuple[str, bool]]:
    """Names of root-graph encoded values and whether each has a registered decoder to try first."""
    from reference_impl import schema

    model = schema.parse_model(model_bytes)
    names = []
    for value in model.graph.encoded_initializer:
        struct_generic = value.WhichOneof("layout") == "struct_type" and \
            value.struct_type.WhichOneof("kind") != "type_ref"
        names.append((value.name, not struct_generic))
    return names


def observe(adapter, model_bytes: bytes, base_dir: str | None,
            buffers: dict[str, str] | None = None) -> dict[str, Outcome]:
    """verify, then every encoded value decoded (or read field by field when it has no decoder), and
    decoded again into a caller buffer of the layout ``buffers`` names for it (``decode_into``)."""
    seen = {"verify": _call(adapter, adapter.verify, model_bytes, base_dir)}
    if seen["verify"].kind != "ok":
        return seen
    try:
        names = value_names(model_bytes)
    except DecodeError:  # the subject accepted bytes the schema's parser refuses: compare() judges that
        return seen
    for name, decodable in names:
        if decodable:
            outcome = _call(adapter, adapter.decode, model_bytes, name, base_dir)
            seen[f"decode:{name}"] = outcome
            layout = (buffers or {}).get(name)
            if layout is not None and outcome.kind == "ok" and takes_out(adapter):
                seen[f"decode-out:{name}:{layout}"] = _call(adapter, decode_into, adapter, model_bytes, name,
                                                            base_dir, _buffer(outcome.value, layout))
            if outcome.kind != "reject" or outcome.code != "CONSUMER_MISSING":
                continue
        reader = getattr(adapter, "read_fields", None)
        if reader is not None:
            seen[f"fields:{name}"] = _call(adapter, reader, model_bytes, name, base_dir)
    return seen


def takes_out(adapter) -> bool:
    """The adapter's ``decode`` accepts a caller buffer (``out=``); adapters that do not are not asked."""
    from conformance.adapters.base import accepted_keywords

    return "out" in accepted_keywords(adapter.decode, out=None)


#: what a caller buffer holds before the decode: a value no decode of the generated models produces there
SENTINEL = 7


def _buffer(decoded: Any, layout: str) -> np.ndarray:
    """A fresh caller buffer of ``decoded``'s dtype and shape in ``layout`` (``fuzz.dimensions.lay_out``)."""
    from fuzz.dimensions import lay_out

    template = np.asarray(decoded)
    return lay_out(np.full(template.shape, SENTINEL, template.dtype), layout)


def decode_into(adapter, model_bytes: bytes, name: str, base_dir: str | None, buffer: np.ndarray) -> dict:
    """``decode(..., out=buffer)`` observed: what it returned, what the buffer holds after, and whether it
    returned the buffer itself (a runtime that decodes elsewhere and copies, or returns its own array,
    differs in the last two)."""
    returned = adapter.decode(model_bytes, name, base_dir, out=buffer)
    return {"returned": np.array(returned), "buffer": np.array(buffer),
            "is_buffer": np.array(returned is buffer)}


def _values_agree(a: Any, b: Any) -> str | None:
    if isinstance(a, dict) or isinstance(b, dict):
        if not isinstance(a, dict) or not isinstance(b, dict) or set(a) != set(b):
            return "different field sets"
        for key in a:
            reason = _values_agree(a[key], b[key])
            if reason:
                return f"field {key}: {reason}"
        return None
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} versus {b.shape}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} versus {b.dtype}"
    if a.dtype == object:
        return None if a.tolist() == b.tolist() else "values differ"
    if a.dtype.kind in "iub":
        return None if np.array_equal(a, b) else "integer values differ"
    x, y = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64), b.astype(
        np.complex128 if b.dtype.kind == "c" else np.float64)
    close = np.isclose(x, y, rtol=RTOL, atol=ATOL) | (np.isnan(x) & np.isnan(y))
    if close.all():
        return None
    where = tuple(int(i) for i in np.argwhere(~close)[0])
    return f"value at {list(where)}: {x[where]} versus {y[where]} beyond rtol={RTOL} atol={ATOL}"


#: Protobuf runtimes disagree on malformed wire bytes: protobuf C++ 3.21 accepts tag varints longer than
#: 32 bits (it truncates them), while upb accepts some unknown groups C++ refuses. The contract says
#: nothing about wire-format leniency, so where the oracle (upb) refuses the bytes as MODEL_PARSE_ERROR
#: whatever a subject answers is not a disagreement; where only the subject refuses them, the target
#: compares again on the oracle's canonical re-serialization (``canonical_bytes``) and reports only what
#: remains there.
PARSE_LENIENCY = "protobuf runtimes may disagree on malformed wire bytes; the contract starts after parsing"


def canonical_bytes(model_bytes: bytes) -> bytes | None:
    """The model as the oracle parsed it, re-serialized without unknown fields (None if unparsable)."""
    from reference_impl import schema

    try:
        model = schema.parse_model(model_bytes)
    except DecodeError:
        return None
    model.DiscardUnknownFields()
    return model.SerializeToString()


def _within_limits(want: Outcome, got: Outcome) -> bool:
    """One side stopped at an implementation limit (``LIMIT_CODES``) where the other went on: the spec
    leaves those figures to the implementation (a deeper catalogue, a larger decode), so neither verdict
    is wrong. A limit code where the other side rejected for a rule is still a code disagreement."""
    return ((want.kind == "reject" and want.code in LIMIT_CODES and got.kind == "ok")
            or (got.kind == "reject" and got.code in LIMIT_CODES and want.kind == "ok"))


def _same_rule(want: Outcome, got: Outcome) -> bool:
    """Both sides reject for the same clause. Codes of one clause name facets of one rule that a single
    input can break together (an extent that overflows is also one no file covers; a type_id that is
    missing is also zero), and the spec orders no checks, so either code is a correct answer."""
    from reference_impl.errors import ErrorCode

    try:
        return ErrorCode(want.code).clause == ErrorCode(got.code).clause
    except ValueError:  # a code the contract does not define: a disagreement
        return False


def parse_disagreement(problems: list[tuple[str, str, str]]) -> bool:
    """Only the subject refused the bytes as unparsable (see ``PARSE_LENIENCY``)."""
    return any(kind == "parse" for _, kind, _ in problems)


def compare(expected: dict[str, Outcome], actual: dict[str, Outcome],
            codes: bool = True) -> list[tuple[str, str, str]]:
    """Disagreements (operation, kind, message) between the oracle's observations and a subject's;
    kind is "parse", "verdict", "code" or "values". Operations the subject does not support are skipped, and so
    are differences the contract leaves open: wire-format leniency, implementation limits and codes of
    one clause. ``codes=False`` compares verdicts and values only, for inputs that may break several
    rules at once (the spec orders no checks, so each broken rule's code is a correct answer)."""
    problems = []
    for key, want in expected.items():
        got = actual.get(key)
        if got is None or got.kind == "unsupported" or want.kind == "unsupported":
            continue
        if key == "verify" and want.kind == "reject" and want.code == "MODEL_PARSE_ERROR":
            continue  # the oracle's parser refused the bytes: see PARSE_LENIENCY
        if _within_limits(want, got):
            continue
        if key == "verify" and got.kind == "reject" and got.code == "MODEL_PARSE_ERROR":
            problems.append((key, "parse", f"{key}: oracle {want}, subject {got}"))  # see PARSE_LENIENCY
        elif want.kind != got.kind:
            problems.append((key, "verdict", f"{key}: oracle {want}, subject {got}"))
        elif codes and want.kind == "reject" and want.code != got.code and not _same_rule(want, got):
            problems.append((key, "code", f"{key}: oracle rejects with {want.code}, subject with {got.code}"))
        elif want.kind == "ok" and key != "verify":
            reason = _values_agree(want.value, got.value)
            if reason:
                problems.append((key, "values", f"{key}: {reason}"))
    return problems


# --------------------------------------------------------------------------------- fault injection
FAULTS = {
    "blocked-tail-scale": "decodes the last, partial block of blocked affine values with the previous "
                          "block's scale",
    "accept-partial-record": "accepts payloads that are not a whole number of records",
    "code-swap": "reports AFFINE_PAYLOAD_SIZE where PAYLOAD_PARTIAL_RECORD is due",
    "native-crash": "aborts the whole process (SIGABRT) when decoding an INT4 affine value, as a crashing "
                    "native runtime would (serve it as a subprocess testee)",
}


class FaultyReference:
    """The reference adapter with one injected fault (``FUZZ_FAULT`` or the ``fault`` argument)."""

    def __init__(self, fault: str | None = None):
        from conformance.adapters.reference import ReferenceAdapter

        self.inner = ReferenceAdapter()
        self.fault = fault or os.environ.get("FUZZ_FAULT", "blocked-tail-scale")
        if self.fault not in FAULTS or self.fault in STATE_FAULTS:
            known = ", ".join(name for name in FAULTS if name not in STATE_FAULTS)
            raise ValueError(f"unknown fault {self.fault!r}; faults are {known} (state faults: faulty_reference())")
        self.name = f"reference+{self.fault}"
        self.version = self.inner.version

    def profiles(self) -> set[str]:
        return self.inner.profiles()

    def classify(self, exc: BaseException):
        return self.inner.classify(exc)

    def verify(self, model_bytes: bytes, base_dir: str | None) -> None:
        self._faulty(lambda: self.inner.verify(model_bytes, base_dir))

    def decode(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> np.ndarray:
        if self.fault == "native-crash" and _storage_of(model_bytes, value_name) == 22:  # INT4
            os.abort()
        result = self._faulty(lambda: self.inner.decode(model_bytes, value_name, base_dir))
        if self.fault == "blocked-tail-scale":
            result = _previous_scale_on_tail(model_bytes, value_name, result)
        return result

    def read_fields(self, model_bytes: bytes, value_name: str, base_dir: str | None):
        return self._faulty(lambda: self.inner.read_fields(model_bytes, value_name, base_dir))

    def _faulty(self, fn):
        from conformance.adapters import Rejected

        try:
            return fn()
        except Exception as error:  # noqa: BLE001 - rewrite one classified verdict
            mapped = self.inner.classify(error)
            if isinstance(mapped, Rejected):
                if self.fault == "accept-partial-record" and mapped.code == "PAYLOAD_PARTIAL_RECORD":
                    return None
                if self.fault == "code-swap" and mapped.code == "PAYLOAD_PARTIAL_RECORD":
                    raise type(mapped)("AFFINE_PAYLOAD_SIZE", mapped.message) from None
            raise


def _storage_of(model_bytes: bytes, name: str) -> int | None:
    from reference_impl import schema

    for value in schema.parse_model(model_bytes).graph.encoded_initializer:
        if value.name == name and value.WhichOneof("layout") == "affine":
            return value.affine.storage_type
    return None


def _previous_scale_on_tail(model_bytes: bytes, name: str, decoded: np.ndarray) -> np.ndarray:
    from reference_impl import schema
    from reference_impl.tensors import to_array

    model = schema.parse_model(model_bytes)
    value = next(v for v in model.graph.encoded_initializer if v.name == name)
    if value.WhichOneof("layout") != "affine" or not value.affine.HasField("block_size") or \
            not value.affine.HasField("axis") or decoded.ndim == 0:
        return decoded
    axis = value.affine.axis % decoded.ndim
    block = value.affine.block_size
    dim = decoded.shape[axis]
    blocks = -(-dim // block)
    if dim % block == 0 or blocks < 2:
        return decoded
    scale = to_array(value.affine.scale, "scale").astype(np.float64)
    tail = [slice(None)] * decoded.ndim
    tail[axis] = slice((blocks - 1) * block, dim)
    last, previous = [slice(None)] * decoded.ndim, [slice(None)] * decoded.ndim
    last[axis], previous[axis] = slice(blocks - 1, blocks), slice(blocks - 2, blocks - 1)
    with np.errstate(all="ignore"):
        ratio = np.where(scale[tuple(last)] != 0, scale[tuple(previous)] / scale[tuple(last)], 1.0)
        wrong = decoded.astype(np.float64)
        wrong[tuple(tail)] *= ratio
    return wrong.astype(decoded.dtype)


# ------------------------------------------------------------------------------ state and KV faults
# Faults in state, binding and KV code that the audit catalogue (``python -m conformance audit --list``)
# lacks, written on its ``Fault`` seam; the catalogue's own faults are subjects as they are
# (``--subject conformance.audit.faults.state:PublishesAfterFailure``).
STATE_FAULTS = {
    "binding-rank-only": "compares bound input and output types by rank only: dimensions that differ at the same "
                         "rank, also inside sequences, optionals and inline structs, are accepted",
    "gqa-interleaved-heads": "maps query head h to key/value head h % kv_heads instead of h // (q_heads / kv_heads) "
                             "under grouped-query attention",
    "causal-top-left": "aligns the causal mask top-left (query i sees keys 0..i) instead of bottom-right, so a "
                       "decode step over a cached past sees only the first keys",
    "kv-copy-per-append": "copies the whole contiguous cache into a fresh allocation on every append instead of "
                          "writing the new tokens behind it (values stay right; buffers and bytes written do not)",
}
FAULTS.update(STATE_FAULTS)

#: One injected fault per fault class the ``statediff`` target must find (tests/test_fuzz_statediff.py,
#: benchmarks/bench_statediff_find.py): class -> (subject adapter, FUZZ_FAULT or None, finding origin part).
STATE_FAULT_CLASSES = {
    "atomic publication": ("conformance.audit.faults.state:PublishesAfterFailure", None, ":state:"),
    "binding dims": ("fuzz.subjects:faulty_reference", "binding-rank-only", ":bindings:open:verdict"),
    "strings in containers": ("conformance.audit.faults.bindings:NestedStringsMissed", None,
                              ":bindings:open:verdict"),
    "GQA head mapping": ("fuzz.subjects:faulty_reference", "gqa-interleaved-heads", ":values"),
    "causal alignment": ("fuzz.subjects:faulty_reference", "causal-top-left", ":values"),
    "cache copying": ("fuzz.subjects:faulty_reference", "kv-copy-per-append", ":contiguous:"),
}


def _rank_only(original):
    from reference_impl.values import TensorSpec

    def incompatibility(a, b):
        if isinstance(a, TensorSpec) and isinstance(b, TensorSpec) and a.dims is not None and b.dims is not None \
                and len(a.dims) == len(b.dims):
            b = TensorSpec(b.elem_type, a.dims)
        return original(a, b)
    return incompatibility


def _interleaved(original):
    """A grouped product whose query head h reads key/value head h % kv_heads (np.tile instead of a
    grouping by consecutive query heads)."""
    def grouped(x, kv):
        groups = x.shape[1] // kv.shape[1]
        return original(x, np.tile(kv, (1, groups, 1, 1)) if groups > 1 else kv)
    return grouped


def _top_left(original):
    def position_bias(q_len, start, stop, offset, attrs, dtype):
        return original(q_len, start, stop, 0, attrs, dtype)
    return position_bias


def _state_fault_classes() -> dict:
    from conformance.audit.fault import Fault, Patch, wrap
    from reference_impl import bindings
    from reference_impl.kv import contiguous

    attention = importlib.import_module("reference_impl.kv.attention")

    class BindingRankOnly(Fault):
        fault_id = "fuzz.binding-rank-only"
        clauses = ("BIND-COMPATIBLE",)

        def patches(self):
            return [wrap(bindings, "incompatibility", _rank_only)]

    class GroupedHeadsInterleaved(Fault):
        fault_id = "fuzz.gqa-interleaved-heads"
        clauses = ("KV-ATTENTION",)

        def patches(self):
            return [wrap(attention, "grouped_scores", _interleaved), wrap(attention, "grouped_values", _interleaved)]

    class CausalTopLeft(Fault):
        fault_id = "fuzz.causal-top-left"
        clauses = ("KV-ATTENTION",)

        def patches(self):
            return [wrap(attention, "position_bias", _top_left)]

    class CacheCopiedPerAppend(Fault):
        fault_id = "fuzz.kv-copy-per-append"
        clauses = ("KV-APPEND-INPLACE", "KV-CAPACITY-REUSE")

        def patches(self):
            return [Patch(contiguous, "_claim_in_place", lambda storage, past, needed: False)]

    return {"binding-rank-only": BindingRankOnly, "gqa-interleaved-heads": GroupedHeadsInterleaved,
            "causal-top-left": CausalTopLeft, "kv-copy-per-append": CacheCopiedPerAppend}


def faulty_reference():
    """Factory for ``load_adapter("fuzz.subjects:faulty_reference")``: the fault named by ``FUZZ_FAULT``."""
    fault = os.environ.get("FUZZ_FAULT", "blocked-tail-scale")
    if fault in STATE_FAULTS:
        return _state_fault_classes()[fault]()
    return FaultyReference(fault)
