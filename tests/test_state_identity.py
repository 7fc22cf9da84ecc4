"""The cases of corpus/cases/state/identity.toml: a call differing from an accepted one in one part is
judged afresh. The reference passes every case; a runtime that keys a cache on less than the result
depends on (validated metadata by name, a compiled plan by first shapes, initial contents or a lowered
model by graph input names, decoded values by code bytes) fails the cases of that part."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from conformance.adapters.reference import ReferenceAdapter, ReferenceState
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import schema
from reference_impl import state as state_module
from reference_impl.executor import kernels, session

#: the manifests the cases were filed in, one per area
_SOURCES = ("cases/bindings/identity.toml", "cases/state/identity.toml")


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source in _SOURCES}


def _verdicts(adapter_factory, ids) -> dict[str, str]:
    return {case_id: run_case(_cases()[case_id], adapter_factory()).verdict for case_id in sorted(ids)}


def _not_failed(adapter_factory, ids) -> set[str]:
    return {case_id for case_id, verdict in _verdicts(adapter_factory, ids).items() if verdict != FAILED}


def test_the_cases_are_there():
    assert len(_cases()) == 15


def test_every_case_passes_on_the_reference():
    assert {case_id for case_id, verdict in _verdicts(ReferenceAdapter, _cases()).items() if verdict != PASSED} == set()


def _validation_cached_by_path(monkeypatch) -> None:
    """Checks a value's metadata the first time a path (``feeds['x']``, ``initial['past']``,
    ``outputs['s_next']``) is seen and trusts every later value at that path."""
    seen: set[str] = set()

    def make(original):
        def check_value(value, spec, path, *args, **kwargs):
            if path in seen:
                return None
            result = original(value, spec, path, *args, **kwargs)
            seen.add(path)
            return result
        return check_value

    for module in (state_module, session):
        monkeypatch.setattr(module, "check_value", make(module.check_value))


def test_validation_cached_by_name_fails_the_changed_part_cases(monkeypatch):
    _validation_cached_by_path(monkeypatch)
    wanted = {f"Required.State.Identity.FeedChangedAfterAccepted{p}" for p in ("Dim", "Rank", "ElementType")}
    wanted |= {f"Required.State.Identity.ResetChangedAfterAccepted{p}" for p in ("Dim", "ElementType")}
    wanted.add("Required.State.Identity.SecondStateElementType")
    assert _not_failed(ReferenceAdapter, wanted) == set()


class _Pinned(ReferenceState):
    """Feeds and reset values are cut or repeated to the shape first seen under their name, as a plan
    compiled for the first call's shapes would read them."""

    def __init__(self, state, shapes: dict, slot=None):
        super().__init__(state, slot)
        self.shapes = shapes

    def _pin(self, values: dict) -> dict:
        pinned = {}
        for name, value in values.items():
            if isinstance(value, np.ndarray):
                shape = self.shapes.setdefault(name, value.shape)
                value = np.resize(value, shape) if value.shape != shape else value
            pinned[name] = value
        return pinned

    def run(self, feeds):
        return super().run(self._pin(feeds))

    def reset(self, initial):
        return super().reset(self._pin(initial))


class ShapesPinnedAtFirstCall(ReferenceAdapter):
    """Compiles the model once per process for the shapes of the first values it sees, by input name."""

    def __init__(self):
        super().__init__()
        self.shapes: dict = {}

    def open_state(self, model_bytes, initial, base_dir=None):
        pinned = _Pinned(None, self.shapes)
        handle = super().open_state(model_bytes, pinned._pin(initial), base_dir)
        return _Pinned(handle.state, self.shapes, handle.slot)


def test_shapes_pinned_at_the_first_call_fail_the_fresh_shape_cases():
    wanted = {f"Required.State.Identity.{name}" for name in (
        "FreshShapeAfterAcceptedFeed", "FreshShapeAfterAcceptedReset", "TwoStatesOneDimInterleaved",
        "TwoStatesOneDimOneAfterAnother")}
    assert _not_failed(ShapesPinnedAtFirstCall, wanted) == set()


def _input_names(model_bytes: bytes) -> tuple[str, ...]:
    return tuple(sorted(vi.name for vi in schema.parse_model(model_bytes).graph.input))


class InitialFoldedByInputNames(ReferenceAdapter):
    """Folds a state's initial contents into the prepared model and caches that preparation by the graph's
    input names: a second state of the model starts from the first state's contents."""

    def __init__(self):
        super().__init__()
        self.prepared: dict = {}

    def open_state(self, model_bytes, initial, base_dir=None):
        folded = self.prepared.setdefault(_input_names(model_bytes), dict(initial))
        return super().open_state(model_bytes, dict(folded), base_dir)


def test_initial_contents_cached_by_input_names_fail_the_two_state_cases():
    wanted = {f"Required.State.Identity.TwoStates{part}{order}" for part in ("OneElement", "OneDim", "ScaleOnly")
              for order in ("Interleaved", "OneAfterAnother")}
    assert _not_failed(InitialFoldedByInputNames, wanted) == set()


class LoweredByInputNames(ReferenceAdapter):
    """Caches the lowered model by the graph's input names: a model differing in one binding only gets the
    lowering of the first."""

    def __init__(self):
        super().__init__()
        self.lowered: dict = {}

    def open_state(self, model_bytes, initial, base_dir=None):
        return super().open_state(self.lowered.setdefault(_input_names(model_bytes), model_bytes), initial, base_dir)


def test_a_lowering_cached_by_input_names_fails_the_unbound_second_state():
    assert _not_failed(LoweredByInputNames, {"Required.Bindings.Identity.SecondStateUnbound"}) == set()


def test_decoded_values_cached_by_code_bytes_fail_the_scale_only_cases(monkeypatch):
    """Decodes once per value type and code bytes (the first 8 payload bytes of a type-1102 value), leaving
    the per-value scale out of the key."""
    memo: dict = {}
    original = kernels.decode_value

    def decode_value(proto, *args, **kwargs):
        key = (proto.struct_type.type_ref, bytes(proto.raw_data)[:8])
        if key not in memo:
            memo[key] = original(proto, *args, **kwargs)
        return memo[key]

    monkeypatch.setattr(kernels, "decode_value", decode_value)
    wanted = {f"Required.State.Identity.TwoStatesScaleOnly{order}" for order in ("Interleaved", "OneAfterAnother")}
    assert _not_failed(ReferenceAdapter, wanted) == set()


@pytest.mark.parametrize(("adapter", "case_id"), [
    (ShapesPinnedAtFirstCall, "Required.State.Identity.TwoStatesOneElementInterleaved"),
    (InitialFoldedByInputNames, "Required.State.Identity.FreshShapeAfterAcceptedReset"),
    (LoweredByInputNames, "Required.State.Identity.TwoStatesOneElementInterleaved"),
])
def test_each_caching_runtime_passes_where_nothing_it_keys_on_changes(adapter, case_id):
    """The faults only go wrong where a later call differs in what they leave out of their key."""
    assert run_case(_cases()[case_id], adapter()).verdict == PASSED
