"""PyTorch CPU tensors enter the state through DLPack without copies; unsupported layouts are rejected.

torch is optional: CI installs the CPU build (torch==2.13.0); elsewhere these tests are skipped.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_state_models import D, address, kv_model, tokens

from reference_impl.errors import ContractError, ErrorCode
from reference_impl.state import make_state

torch = pytest.importorskip("torch")


@pytest.mark.clause("ZC-ENTRY-POINTS", "ZC-RETAIN")
def test_torch_initial_values_and_feeds_are_shared_not_copied():
    past = torch.zeros((1, 2, D), dtype=torch.float32)
    state = make_state(kv_model(), {"past_key": past})
    assert address(state.values["past_key"]) == past.data_ptr()
    feed = torch.tensor([[3, 1]], dtype=torch.int64)
    out = state.run({"tokens": feed})
    assert address(out["seen_past"]) == past.data_ptr()
    assert out["present_key"].shape == (1, 4, D)
    again = state.run({"tokens": tokens(2)})
    assert address(again["seen_past"]) == address(out["present_key"])
    assert state.counters.payload_bytes_copied == 0 and state.counters.payload_allocations == 0
    past[0, 0, 0] = 5.0  # shared storage: the caller's tensor and the first output alias (no snapshot)
    assert float(out["seen_past"][0, 0, 0]) == 5.0


@pytest.mark.clause("ZC-ENTRY-POINTS", "PAY-UNSUPPORTED-OWNERSHIP")
@pytest.mark.parametrize("make", [
    lambda: torch.zeros((1, D, 2)).transpose(1, 2),                       # non-contiguous
    lambda: torch.zeros((1, 2, D), requires_grad=True),                   # autograd-owned
], ids=["non-contiguous", "requires-grad"])
def test_unsupported_torch_tensors_rejected(make):
    with pytest.raises(ContractError) as info:
        make_state(kv_model(), {"past_key": make()})
    assert info.value.code is ErrorCode.STATE_UNRETAINABLE


def test_torch_feed_with_wrong_dtype_is_a_type_error_not_a_conversion():
    state = make_state(kv_model(), {"past_key": np.zeros((1, 0, D), np.float32)})
    with pytest.raises(ContractError) as info:
        state.run({"tokens": torch.tensor([[1]], dtype=torch.int32)})
    assert info.value.code is ErrorCode.STATE_VALUE_INCOMPATIBLE
