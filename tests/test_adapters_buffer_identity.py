"""The buffer-identity recipe of docs/adapters.md for a runtime whose conversion to NumPy copies: map each
copy to its runtime buffer by the copy's data address. The lowering base hands returned and retained arrays
out as new read-only views, so a map keyed by the copy's id() finds nothing and the identity cases fail,
while the documented recipe keeps every identity the non-copying evaluator has."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from conformance.adapters.onnx_reference import EvaluatorSession, OnnxReferenceAdapter
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case

ADAPTERS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "adapters.md"
CASES = ("Required.ZeroCopy.Retain.SelectedOutputBecomesState", "Required.ZeroCopy.Views.ValuesAreSharedViews",
         "Required.ZeroCopy.Retain.NextCallReceivesSameBuffer")


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


class CopyingSession(EvaluatorSession):
    """The reference evaluator with a to_numpy that copies; its runtime buffers are the evaluator's arrays."""

    def __init__(self, model_bytes: bytes):
        super().__init__(model_bytes)
        self.ids: dict[int, int] = {}
        self.keep: list = []

    def to_numpy(self, handle):
        array = np.array(handle, copy=True)
        if array.size:
            self.ids[self.key(array)] = _address(np.asarray(handle))
        self.keep.append((array, handle))
        return array

    def buffer_id(self, value):
        if isinstance(value, np.ndarray) and value.size:
            return self.ids.get(self.key(value))
        return None


class ByAddress(CopyingSession):
    """docs/adapters.md's recipe."""

    key = staticmethod(_address)


class ById(CopyingSession):
    """The recipe the doc gave before: keyed by the copy's id()."""

    key = staticmethod(id)


def _adapter(session: type) -> OnnxReferenceAdapter:
    adapter = OnnxReferenceAdapter()
    adapter.stateless = session
    return adapter


@pytest.mark.parametrize("case_id", CASES)
def test_the_documented_recipe_keeps_identities_through_the_read_only_views(case_id):
    case = next(c for c in load_cases() if c.id == case_id)
    assert run_case(case, OnnxReferenceAdapter()).verdict == PASSED  # the evaluator shares its arrays
    assert run_case(case, _adapter(ByAddress)).verdict == PASSED
    assert run_case(case, _adapter(ById)).verdict == FAILED


def test_the_doc_keys_copies_by_data_address():
    text = ADAPTERS.read_text()
    assert 'self.ids[array.__array_interface__["data"][0]]' in text
    assert "keyed by the\n  copy's `id()`" not in text
