"""Arena-backed outputs: retained state keeps each arena region leased, so it cannot be recycled while
referenced, and releasing the last reference returns it to the arena (clauses PAY-OWNERLESS, ZC-RETAIN,
ZC-OUTSTANDING)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from test_state import Hook, hook_model

from reference_impl import ContractError, ErrorCode
from reference_impl.executor import Executor
from reference_impl.state import make_state


class Lease:
    """One arena region handed to a kernel; NumPy views of it keep the lease (and the arena) alive."""

    def __init__(self, arena: Arena, slot: int):
        self.arena = arena
        self.slot = slot
        view = arena.buffer[slot]
        self.__array_interface__ = {"shape": view.shape, "typestr": view.dtype.str, "version": 3,
                                    "data": (view.__array_interface__["data"][0], False)}


class Arena:
    """A fixed pool of FLOAT[2] regions; a region is reused only once nothing references its lease."""

    def __init__(self, slots: int):
        self.buffer = np.zeros((slots, 2), np.float32)
        self.leased: dict[int, weakref.ref] = {}
        self.recycled = 0

    def allocate(self) -> np.ndarray:
        for slot in range(len(self.buffer)):
            ref = self.leased.get(slot)
            if ref is None or ref() is None:
                if ref is not None:
                    self.recycled += 1
                lease = Lease(self, slot)
                self.leased[slot] = weakref.ref(lease)
                return np.asarray(lease)
        raise MemoryError("arena exhausted: every region is still referenced")

    def live_slots(self) -> set[int]:
        return {slot for slot, ref in self.leased.items() if ref() is not None}

    def slot_of(self, array: np.ndarray) -> int:
        offset = array.__array_interface__["data"][0] - self.buffer.__array_interface__["data"][0]
        return offset // self.buffer.strides[0]


def arena_state_with(slots: int):
    arena = Arena(slots)
    hook = Hook()

    def into_arena(inputs, ctx):
        out = arena.allocate()
        np.copyto(out, inputs[0])  # the kernel computes into arena storage
        return out

    hook.action = into_arena
    state = make_state(Executor(hook_model(), kernels={("test", "Hook"): hook}), {"x": np.zeros(2, np.float32)})
    return arena, state


@pytest.fixture
def arena_state():
    return arena_state_with(4)


@pytest.mark.clause("ZC-RETAIN", "PAY-OWNERLESS", "PAY-ARENA")
def test_retained_arena_output_keeps_its_region_leased(arena_state):
    arena, state = arena_state
    out = state.run({"u": np.ones(2, np.float32)})
    retained = state.values["x"]
    slot = arena.slot_of(retained)
    assert arena.slot_of(out["y"]) == slot  # retained by reference, not copied out of the arena
    del out
    gc.collect()
    assert slot in arena.live_slots()  # the state alone keeps the region from being recycled
    assert retained.tolist() == [1.0, 1.0]


@pytest.mark.clause("ZC-OUTSTANDING", "ZC-NO-INPLACE", "PAY-ARENA")
def test_regions_recycle_only_after_every_reference_is_gone():
    arena, state = arena_state_with(5)
    held = [state.run({"u": np.ones(2, np.float32)})["y"] for _ in range(3)]  # x = 1, 2, 3
    gc.collect()
    assert len(arena.live_slots()) == 3 and arena.recycled == 0
    # Three regions are held by the caller and one is retained by the state while the next call
    # computes, so two regions alternate: each step recycles one, never a held or retained one.
    for _ in range(4):
        state.run({"u": np.ones(2, np.float32)})
        gc.collect()
    assert [h.tolist() for h in held] == [[1, 1], [2, 2], [3, 3]]
    assert state.values["x"].tolist() == [7.0, 7.0]
    assert arena.recycled == 2 and len(arena.live_slots()) == 4


@pytest.mark.clause("ZC-OUTSTANDING")
def test_views_outlive_reset_and_close_and_then_release_the_region(arena_state):
    arena, state = arena_state
    state.run({"u": np.full(2, 5, np.float32)})
    view = state.values["x"]
    slot = arena.slot_of(view)
    state.reset({"x": np.zeros(2, np.float32)})
    state.close()
    gc.collect()
    assert slot in arena.live_slots() and view.tolist() == [5.0, 5.0]
    del view
    gc.collect()
    assert slot not in arena.live_slots()


def test_an_exhausted_arena_fails_the_run_and_keeps_the_state(arena_state):
    arena, state = arena_state
    held = [state.run({"u": np.ones(2, np.float32)})["y"] for _ in range(4)]
    before = state.values
    with pytest.raises(ContractError) as info:
        state.run({"u": np.ones(2, np.float32)})
    assert info.value.code is ErrorCode.STATE_RUN_FAILED and "arena exhausted" in info.value.message
    assert state.values is before and held[-1].tolist() == [4.0, 4.0]
