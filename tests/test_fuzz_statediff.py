"""The statediff target: state, binding and KV scripts compared between the oracle and a subject.

What the comparison accepts (the reference against itself, in process and through the testee; what the
spec leaves open) and what it reports (verdicts, codes, values, buffer relations, counters), and, for each
fault class, a fixed-seed campaign that finds an injected fault within 60 s.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from fuzz import statediff
from fuzz.source import RandomSource
from fuzz.statescript import Op
from fuzz.subjects import STATE_FAULT_CLASSES, Outcome

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTEE = f"{sys.executable} -m conformance.testee"
CEILING = 60  # seconds: the campaign's whole time budget, so a finding comes within it or not at all


def _scenario(seed, held: bool = True):
    scn = statediff.scenario(RandomSource(f"t{seed}"), held)
    statediff.freeze(scn.initial)
    return scn


def _problems(oracle, subject, scn, by_value: bool = False):
    want = statediff.play(oracle, scn, by_value)
    got = statediff.play(subject, scn, by_value)
    return statediff.compare(scn, want, got)


@pytest.fixture(scope="module")
def reference():
    from conformance.adapters.reference import ReferenceAdapter

    return ReferenceAdapter()


# ----------------------------------------------------------------------------------------- generation
def test_scenarios_reach_every_family_operation_and_verdict(reference):
    """Families, held and cancelled calls, branches and quantized caches are generated, and the oracle
    answers them with the codes of the rules they exercise."""
    families, kinds, codes = Counter(), Counter(), Counter()
    for seed in range(400):
        scn = _scenario(seed)
        families[scn.family.split("/")[0] + ("+quantized" if scn.recompute else "")] += 1
        kinds.update(op.kind for op in scn.ops)
        record = statediff.play(reference, scn)
        codes.update(o.code for o in record.outcomes.values() if o.kind == "reject")
        codes.update(cause for o in record.outcomes.values() for cause in o.causes)
    assert {"state", "contiguous", "paged", "paged+quantized", "bindings"} <= set(families)
    assert {"held_run", "held_reset", "held_close", "held_cancel", "held_other", "run_cancelled"} <= set(kinds)
    assert {"STATE_BUSY", "STATE_CANCELLED", "STATE_CLOSED", "BINDING_STRING", "BINDING_INCOMPATIBLE",
            "STATE_INITIAL_MISSING", "STATE_VALUE_INCOMPATIBLE", "OWNERLESS_BORROW",
            "KV_CAPACITY_INVALID", "KV_CAPACITY_EXCEEDED"} <= set(codes)
    # Broken decode feeds (a head too many, a mask of the wrong length or type) contradict the declared
    # input types, so the oracle refuses them as STATE_VALUE_INCOMPATIBLE before Attention runs.


def test_held_operations_are_left_out_for_subjects_without_holds():
    kinds = {op.kind for seed in range(200) for op in statediff.scenario(RandomSource(f"t{seed}"), False).ops}
    assert not {kind for kind in kinds if kind.startswith("held")}


# ---------------------------------------------------------------------------------------- agreement
def test_the_reference_agrees_with_itself(reference):
    from conformance.adapters.reference import ReferenceAdapter

    other = ReferenceAdapter()
    for seed in range(300):
        assert _problems(reference, other, _scenario(seed)) == []


def test_the_reference_agrees_with_itself_through_the_testee(reference):
    """Buffer ids from another process, values passed back by copy, held runs bridged by Hold requests."""
    from conformance.adapters.testee_client import TesteeAdapter

    testee = TesteeAdapter(TESTEE)
    try:
        for seed in range(120):
            assert _problems(reference, testee, _scenario(seed), by_value=True) == []
    finally:
        testee.shutdown()


# -------------------------------------------------------------------------------------- comparison
def _record(outcomes: dict) -> statediff.Record:
    return statediff.Record(outcomes=dict(outcomes))


def _state_scenario() -> statediff.Scenario:
    return statediff.Scenario("state", None, {"s0": "next0"}, {}, [Op("run"), Op("run")])


def test_a_rejection_naming_the_oracles_cause_is_the_same_code():
    failed = Outcome("reject", "STATE_RUN_FAILED", causes=("KV_CAPACITY_EXCEEDED",))
    scn = _state_scenario()
    cause = Outcome("reject", "KV_CAPACITY_EXCEEDED")
    assert statediff.compare(scn, _record({"open": failed}), _record({"open": cause})) == []
    other = Outcome("reject", "EXECUTION_FAILED")
    problems = statediff.compare(scn, _record({"open": failed}), _record({"open": other}))
    assert problems and problems[0][1] == "code"


def test_what_the_spec_leaves_open_ends_the_comparison_without_a_finding():
    """A reset that waits for the held run (instead of STATE_BUSY), a cancellation that comes too late and a
    strided caller buffer retained as it is all conform; what follows them is not compared."""
    scn = _state_scenario()
    busy, ok = Outcome("reject", "STATE_BUSY"), Outcome("ok", value={})
    want = _record({"0:held_reset": ok, "0:held_reset:second": busy, "1:run": ok})
    got = _record({"0:held_reset": ok, "0:held_reset:second": ok, "1:run": Outcome("reject", "STATE_CLOSED")})
    got.waited["0:held_reset"] = True
    assert statediff.compare(scn, want, got) == []
    got.waited["0:held_reset"] = False  # accepted while the run was still parked: a race
    assert statediff.compare(scn, want, got)[0][1] == "verdict"
    cancelled = _record({"0:held_cancel": Outcome("reject", "STATE_CANCELLED"), "1:run": ok})
    late = _record({"0:held_cancel": ok, "1:run": Outcome("reject", "STATE_CLOSED")})
    assert statediff.compare(scn, cancelled, late) == []
    strided = _record({"0:reset": Outcome("reject", "STATE_UNRETAINABLE"), "1:run": ok})
    retained = _record({"0:reset": ok, "1:run": Outcome("reject", "STATE_CLOSED")})
    assert statediff.compare(scn, strided, retained) == []
    assert statediff.compare(scn, retained, strided)  # refusing what the oracle retains is a finding


def test_a_queued_second_call_is_a_finding():
    scn = _state_scenario()
    want = _record({"0:held_run": Outcome("ok", value={}), "0:held_run:second": Outcome("reject", "STATE_BUSY")})
    got = _record({"0:held_run": Outcome("ok", value={}), "0:held_run:second": Outcome("ok", value={})})
    got.waited["0:held_run"] = True
    assert statediff.compare(scn, want, got)[0][1] == "verdict"


def test_buffer_relations_not_ids_are_compared():
    scn = _state_scenario()
    want, got = statediff.Record(), statediff.Record()
    want.ids = {"open.in|s0": 10, "0.out|next0": 20, "0.after|s0": 20, "0.out|y": 30}
    got.ids = {"open.in|s0": 7, "0.out|next0": 8, "0.after|s0": 8, "0.out|y": 9}  # other numbers, same relations
    assert statediff.compare(scn, want, got) == []
    got.ids["0.after|s0"] = 11  # values() returned a copy of what the run retained
    problems = statediff.compare(scn, want, got)
    assert problems[0][1] == "identity" and "0.after|s0" in problems[0][2] and "0.out|next0" in problems[0][2]
    got.ids["0.after|s0"], got.ids["0.out|y"] = 8, 8  # a computed output aliases the retained value
    assert statediff.compare(scn, want, got)[0][1] == "identity"


def test_counter_growth_is_compared_per_step():
    scn = statediff.Scenario("contiguous", None, {}, {}, [Op("run")], counters=statediff.KV_COUNTERS)
    steps = {"open": Outcome("ok"), "0:run": Outcome("ok", value={})}
    want, got = _record(steps), _record(steps)
    want.counters = {"open": {"binding_resolutions": 1, "kv_bytes_written": 0},
                     "0": {"binding_resolutions": 1, "kv_bytes_written": 32, "attention_peak_workspace_bytes": 9}}
    got.counters = {"open": {"binding_resolutions": 1, "kv_bytes_written": 0},
                    "0": {"binding_resolutions": 1, "kv_bytes_written": 32, "attention_peak_workspace_bytes": 900}}
    assert statediff.compare(scn, want, got) == []  # the workspace is the runtime's own business
    got.counters["0"]["kv_bytes_written"] = 96  # the append copied the cache
    assert statediff.compare(scn, want, got)[0][1] == "counters"
    got.counters["0"]["kv_bytes_written"] = 32
    got.counters["0"]["binding_resolutions"] = 2  # resolved again when it ran
    assert statediff.compare(scn, want, got)[0][1] == "counters"
    del got.counters["0"]["binding_resolutions"]  # a counter the subject does not report is not compared
    assert statediff.compare(scn, want, got) == []


def _quantized_scenarios(count: int):
    found = []
    seed = 0
    while len(found) < count:
        scn = statediff.scenario(RandomSource(f"q{seed}"), False)
        seed += 1
        decodes = sum(op.kind == "run" for op in scn.ops)
        if scn.recompute and decodes >= 4 and "max_tokens" not in str(scn.model.graph.node):
            statediff.freeze(scn.initial)
            found.append(scn)
    return found


def _scaled_quantization(factor: float):
    """A subject whose affine KV blocks use ``factor`` times the reference's scale (a different encoder)."""
    from conformance.audit.fault import Fault, wrap
    from reference_impl.kv import formats

    def make(original):
        def parameters(values, storage_type):
            scale, zero_point = original(values, storage_type)
            return (np.asarray(scale) * np.float32(factor)).astype(np.asarray(scale).dtype), zero_point
        return parameters

    class ScaledQuantization(Fault):
        fault_id = f"test.kv-scale-x{factor}"
        clauses = ("KV-PAGED-FORMATS",)

        def patches(self):
            return [wrap(formats, "_affine_parameters", make)]

    return ScaledQuantization()


def test_another_encoding_of_a_block_format_is_not_a_disagreement(reference):
    """How a block is quantized is the runtime's: Y must be attention over what the subject's own blocks
    decode to, whatever scales it chose; the block formats and token ranges must be the oracle's."""
    scenarios = _quantized_scenarios(40)
    assert all(_problems(reference, _scaled_quantization(1.5), scn) == [] for scn in scenarios)


def test_attention_that_misreads_a_quantized_cache_is_found(reference):
    """A subject that leaves out the per-token scales of quantized blocks when it attends over them."""
    import importlib

    from conformance.audit.fault import Fault, Patch

    paged_attention = importlib.import_module("reference_impl.kv.paged_attention")

    class ScalesIgnored(Fault):
        fault_id = "test.kv-block-scales-ignored"
        clauses = ("KV-PAGED-FORMATS",)

        def patches(self):
            return [Patch(paged_attention, "_scaled", lambda x, scale: x)]

    assert any(_problems(reference, ScalesIgnored(), scn) for scn in _quantized_scenarios(40))


# -------------------------------------------------------------------------------------- campaigns
def _campaign(tmp_path, *options, fault: str | None = None) -> tuple[dict, str]:
    env = dict(os.environ, FUZZ_FAULT=fault or "")
    command = [sys.executable, "-m", "fuzz", "run", "statediff", "--time", str(CEILING), "--seed", "1",
               "--stop-on-finding", "--quiet", "--out", str(tmp_path / "out"), "--corpus", str(tmp_path / "corpus"),
               *options]
    subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CEILING + 120)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    return report, (tmp_path / "out" / "logs" / "job-0.log").read_text()


@pytest.mark.parametrize("fault_class", list(STATE_FAULT_CLASSES))
def test_the_campaign_finds_each_fault_class_within_a_minute(tmp_path, fault_class):
    """One injected fault per class (fuzz.subjects.STATE_FAULT_CLASSES); the campaign is given 60 s in all,
    so a report with a finding is a finding within 60 s (typical times: benchmarks/bench_statediff_find.py)."""
    subject, fault, origin = STATE_FAULT_CLASSES[fault_class]
    report, log = _campaign(tmp_path, "--subject", subject, fault=fault)
    assert report["findings"], f"{fault_class}: nothing found in {report['seconds']} s"
    first = next(sample["t"] for sample in report["timeline"] if sample["findings"])
    assert first <= CEILING
    assert "FINDING disagreement" in log and origin in log.split("FINDING disagreement", 1)[1].splitlines()[0]


def test_the_campaign_finds_a_fault_behind_the_subprocess_testee(tmp_path):
    subject, _, origin = STATE_FAULT_CLASSES["atomic publication"]
    report, log = _campaign(tmp_path, "--testee", f"{TESTEE} --adapter {subject}")
    assert report["findings"]
    assert "FINDING disagreement" in log and origin in log.split("FINDING disagreement", 1)[1].splitlines()[0]
