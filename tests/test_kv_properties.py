"""KV append equals concatenation and paged equals dense, over generated operation scripts that
branch from old caches, hold views, mix block formats and convert blocks; every KV code is produced."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fuzz import kvscript as K
from fuzz import properties as P
from fuzz.source import HypothesisSource, RandomSource
from fuzz.strategies import profile

pytestmark = pytest.mark.clause("KV-APPEND-EQUIV", "KV-PAGED-FORMATS", "KV-PAGED-RANGE", "KV-ATTENTION",
                                  "KV-MUTATION-FAILED", "KV-CAPACITY-INVALID")


class KVMachine(RuleBasedStateMachine):
    @initialize(data=st.data())
    def start(self, data):
        self.runner = K.KVRunner.create(HypothesisSource(data.draw))

    @rule(data=st.data())
    def step(self, data):
        self.runner.step(HypothesisSource(data.draw))

    @invariant()
    def presents_equal_concatenations(self):
        if hasattr(self, "runner"):
            self.runner.check()


TestKVMachine = KVMachine.TestCase
TestKVMachine.settings = profile(scale=1)


def test_every_kv_code_is_produced():
    seen = set()
    for seed in range(60):
        seen.update(K.run_kv_script(RandomSource(f"kv-{seed}"), steps=10))
    assert {code.value for code in K.KV_CODES} <= seen


def test_a_corrupted_present_is_detected():
    runner = K.KVRunner.create(RandomSource("corrupt"))
    for _ in range(5):
        runner._append(RandomSource("append"))
    present, expected = runner.pasts[-1]
    runner.pasts[-1] = (present, expected + 1.0) if expected.size else (present, expected[:, :, :0])
    if expected.size:
        with pytest.raises(K.Mismatch):
            runner.check()


def test_the_bridged_kv_property_catches_a_wrong_kernel(monkeypatch):
    """The KV property the ``properties`` fuzz target bridges is not vacuous: paged attention that is off
    by 1e-3 fails it."""
    exact = K.paged_attention
    monkeypatch.setattr(K, "paged_attention", lambda *args, **kwargs: exact(*args, **kwargs) + 1e-3)
    # Only an attention step over a non-empty paged cache meets the wrong kernel, and a random search may
    # miss one within its budget: the bridged property runs derandomized, so the outcome is the same each run.
    bridged = P.kv_scripts_equal_concatenation_and_dense_attention.hypothesis.inner_test
    search = settings(derandomize=True, database=None, max_examples=1000, deadline=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))(given(st.data())(bridged))
    with pytest.raises(K.Mismatch):
        search()


test_kv_scripts_keep_their_laws_when_bridged = P.kv_scripts_equal_concatenation_and_dense_attention
