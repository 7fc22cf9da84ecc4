"""Checking the oracle's answers on generated inputs against what the generator knows.

``check_valid`` runs every operation on a valid ``Generated`` model and compares record sizes, every
field's bit patterns and constants, decoded tensors and resolved bindings with the generator's own
expectations. ``check_near_valid`` compares a near-valid case's verdict with its expected code. Both
raise ``Mismatch`` (an AssertionError) describing the first disagreement.
"""

from __future__ import annotations

import numpy as np

from fuzz import gen
from fuzz import layouts as L
from fuzz.cases import FuzzCase, Verdict, run_case
from fuzz.gen import Expected, Generated
from reference_impl import ContractError, ErrorCode, verify_model
from reference_impl.bindings import validate_bindings
from reference_impl.decode import decode_value, read_fields


class Mismatch(AssertionError):
    """The oracle's answer differs from what the input's construction implies."""


def _same_values(expected: np.ndarray, actual: np.ndarray) -> bool:
    """Equal dtype-independent values, NaN equal to NaN (object arrays compared elementwise)."""
    if expected.dtype == object or actual.dtype == object:
        return expected.shape == actual.shape and list(expected.ravel()) == list(actual.ravel())
    a = np.asarray(expected).astype(np.complex128 if np.iscomplexobj(expected) else np.float64)
    b = np.asarray(actual).astype(a.dtype)
    return a.shape == b.shape and bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


def compare_fields(expected: Expected, fields: dict) -> None:
    leaf_paths = {leaf.path for leaf, _ in expected.leaves}
    wanted = leaf_paths | set(expected.constants)
    if set(fields) != wanted:
        raise Mismatch(f"{expected.name}: fields {sorted(fields)} != expected {sorted(wanted)}")
    for leaf, patterns in expected.leaves:
        actual = fields[leaf.path]
        if actual.shape != (expected.records,) + leaf.shape:
            raise Mismatch(f"{expected.name}.{leaf.path}: shape {actual.shape}, expected "
                           f"{(expected.records,) + leaf.shape}")
        got = L.as_patterns(leaf, actual)
        want = L.expected_for_compare(leaf, patterns)
        if not np.array_equal(got, want):
            where = np.argwhere(np.any(got != want, axis=-1))[0].tolist()
            raise Mismatch(f"{expected.name}.{leaf.path}: bit pattern at {where} is "
                           f"{got[tuple(where)].tolist()}, expected {want[tuple(where)].tolist()}")
    for path, constant in expected.constants.items():
        actual = np.asarray(fields[path])
        if actual.shape != constant.shape or not _same_values(constant, actual):
            raise Mismatch(f"{expected.name}.{path}: constant {actual!r}, expected {constant!r}")


def compare_decoded(expected: Expected, actual: np.ndarray) -> None:
    want = expected.decoded
    if actual.dtype != want.dtype:
        raise Mismatch(f"{expected.name}: decoded dtype {actual.dtype}, expected {want.dtype}")
    if actual.shape != want.shape:
        raise Mismatch(f"{expected.name}: decoded shape {actual.shape}, expected {want.shape}")
    if not _same_values(want, actual):
        diff = np.argwhere(~((want.astype(np.float64) == actual.astype(np.float64)) |
                             (np.isnan(want.astype(np.float64)) & np.isnan(actual.astype(np.float64)))))
        first = tuple(diff[0]) if len(diff) else ()
        raise Mismatch(f"{expected.name}: decoded {actual[first]!r} at {list(first)}, expected {want[first]!r}")


def _check_no_decoder(name: str, value, catalogue, base_dir: str, path: str) -> None:
    """Decoding a value whose type_id has no registered decoder fails with CONSUMER_MISSING."""
    try:
        decode_value(value, catalogue, base_dir, path=path)
    except ContractError as error:
        if error.code is not ErrorCode.CONSUMER_MISSING:
            raise Mismatch(f"{name}: decoding it is {error.code.value}, expected CONSUMER_MISSING") from None
        return
    raise Mismatch(f"{name}: decoded although no decoder is registered for its type_id")


def check_valid(generated: Generated, base_dir: str) -> None:
    """Every operation on a valid model succeeds with exactly the generator's expected results."""
    model = generated.model
    try:
        verified = verify_model(model, base_dir=base_dir)
    except ContractError as error:
        raise Mismatch(f"valid model rejected: {error}") from None
    values = {v.name: (i, v) for i, v in enumerate(model.graph.encoded_initializer)}
    for name, expected in generated.values.items():
        index, value = values[name]
        path = f"model.graph.encoded_initializer[{index}]"
        info = verified.encoded[name]
        if expected.record_bytes is not None and (info.element_bytes, info.record_count) != \
                (expected.record_bytes, expected.records):
            raise Mismatch(f"{name}: {info.record_count} records of {info.element_bytes} bytes, expected "
                           f"{expected.records} of {expected.record_bytes}")
        if expected.logical_count is not None and info.logical_count != expected.logical_count:
            raise Mismatch(f"{name}: {info.logical_count} logical elements, expected {expected.logical_count}")
        if expected.kind == "no-decoder":  # a registered type's declaration under another type_id
            _check_no_decoder(name, value, verified.catalogue, base_dir, path)
            continue
        try:
            if expected.kind == "fields":
                compare_fields(expected, read_fields(value, verified.catalogue, base_dir, path))
            else:
                compare_decoded(expected, decode_value(value, verified.catalogue, base_dir, path=path))
        except ContractError as error:
            raise Mismatch(f"{name}: valid value refused: {error}") from None
    try:
        bindings = validate_bindings(model, verified.catalogue)
    except ContractError as error:
        raise Mismatch(f"valid bindings refused: {error}") from None
    resolved = [(b.input_name, b.output_name) for b in bindings]
    if resolved != generated.bindings:
        raise Mismatch(f"bindings resolved as {resolved}, declared {generated.bindings}")


def check_runtime(generated: Generated, base_dir: str) -> None:
    """The valid model loads into the executor (encoded initializers mapped or read from their files,
    every declared type compiled) and makes a state over its bindings; one call returns every bound
    input's value as the output it feeds back, by reference. Catalogue-typed state values share their
    sub-structures (``gen.runtime_value``), so a diamond-shaped catalogue must stay linear here."""
    from reference_impl import Executor, make_state

    model = generated.model
    try:
        executor = Executor(model, base_dir=base_dir)
    except ContractError as error:
        raise Mismatch(f"valid model refused by the executor: {error}") from None
    declarations = {decl.type_id: decl for decl in model.struct_types}
    memo: dict = {}
    values = {vi.name: gen.runtime_value(vi.type, declarations, memo) for vi in model.graph.input}
    bound = dict(generated.bindings)
    try:
        state = make_state(executor, {name: values[name] for name in bound})
        outputs = state.run({name: value for name, value in values.items() if name not in bound})
    except ContractError as error:
        raise Mismatch(f"valid state refused: {error}") from None
    retained = state.values
    for input_name, output_name in generated.bindings:
        if outputs[output_name] is not retained[input_name]:
            raise Mismatch(f"output {output_name!r} is not the value retained for {input_name!r}")
    state.close()


def check_near_valid(case: FuzzCase, verdict: Verdict) -> None:
    if verdict.code != case.expected:
        raise Mismatch(f"{case.rule}: expected {case.expected}, oracle says {verdict}")


def run_near_valid(case: FuzzCase) -> Verdict:
    verdict, _ = run_case(case)
    check_near_valid(case, verdict)
    return verdict
