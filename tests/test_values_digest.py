"""Expectations by digest (conformance/digests.py, ``values_digest`` / ``fields_digest`` in a case): a value
passes only with the expected dtype, shape and canonical bytes, and a failure names the first differing
sampled element and where it sits."""

from __future__ import annotations

import hashlib

import ml_dtypes
import numpy as np

from conformance import digests

COUNT = (1 << 20) + (1 << 12) + 7


def _expected() -> np.ndarray:
    return (np.arange(COUNT) % 10007).astype(np.float32) * np.float32(0.25)


def _spec(values: np.ndarray) -> dict:
    return {"sha256": hashlib.sha256(values.astype("<f4").tobytes()).hexdigest(), "dtype": "float32",
            "shape": list(values.shape)}


def _samples(values: np.ndarray) -> dict:
    index = digests.sample_indices(values.size)
    return {"index": index, "values": values.reshape(-1)[index]}


def test_sample_positions_cover_both_ends_every_power_of_two_and_a_sweep():
    index = digests.sample_indices(COUNT)
    assert index[0] == 0 and index[-1] == COUNT - 1 and np.all(np.diff(index) > 0)
    for power in range(10, 21):
        assert {(1 << power) - 1, 1 << power} <= set(index.tolist())
    assert len(set((index % 4093).tolist())) < index.size  # the sweep repeats every residue class
    assert digests.region(COUNT - 3, COUNT) == "among the last elements"
    assert digests.region((1 << 16) + 2, COUNT) == "around 2^16 = 65536"
    assert digests.region(4093 * 100, COUNT) == "in the strided sweep"


def test_the_expected_value_passes():
    values = _expected()
    assert digests.mismatch(_spec(values), values.copy(), _samples(values)) is None


def test_a_dropped_tail_is_named_by_its_first_sampled_element():
    values = _expected()
    actual = values.copy()
    actual[1 << 20:] = 0
    reason = digests.mismatch(_spec(values), actual, _samples(values))
    assert reason.startswith("value: element 1048576 [1048576] (around 2^20 = 1048576) is ")
    assert "sampled elements differ" in reason


def test_a_difference_between_samples_fails_on_the_digest():
    values = _expected()
    actual = values.copy()
    actual[12345] += 1  # no sample position
    assert 12345 not in set(digests.sample_indices(COUNT).tolist())
    reason = digests.mismatch(_spec(values), actual, _samples(values))
    assert "differ from the expected ones" in reason and "the difference lies elsewhere" in reason
    assert "differ from the expected ones" in digests.mismatch(_spec(values), actual)


def test_dtype_and_shape_are_checked_first():
    values = _expected()
    assert "dtype float64, expected float32" in digests.mismatch(_spec(values), values.astype(np.float64))
    assert "shape [1, 1052679], expected [1052679]" in digests.mismatch(_spec(values), values.reshape(1, -1))


def test_negative_zero_counts_as_zero():
    values = np.array([0.0, 1.5, -2.0], np.float32)
    actual = np.array([-0.0, 1.5, -2.0], np.float32)
    assert digests.mismatch(_spec(values), actual) is None
    for dtype in (np.float16, ml_dtypes.bfloat16):
        assert digests.sha256(np.array([-0.0, 1.0], dtype)) == digests.sha256(np.array([0.0, 1.0], dtype))


def test_integers_of_another_width_compare_when_they_fit():
    values = np.array([3, -4, 5], np.int8)
    spec = {"sha256": hashlib.sha256(values.tobytes()).hexdigest(), "dtype": "int8", "shape": [3]}
    assert digests.mismatch(spec, values.astype(np.int64)) is None
    assert "do not fit" in digests.mismatch(spec, np.array([3, -4, 500]))


def test_a_digest_fed_in_parts_equals_the_whole():
    values = _expected()
    digest = digests.Digest(np.float32)
    for start in range(0, COUNT, 100003):
        digest.update(values[start:start + 100003])
    assert digest.hexdigest() == digests.sha256(values)
