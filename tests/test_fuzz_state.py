"""The state helper equals the manual output-to-input loop, under a Hypothesis state machine and
over generated operation scripts; every state error code is produced by a script operation."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fuzz import statescript as S
from fuzz.source import HypothesisSource, RandomSource
from fuzz.strategies import profile
from reference_impl.errors import ErrorCode

pytestmark = pytest.mark.clause("STATE-EQUIV-LOOP", "STATE-ATOMIC", "STATE-FEEDS", "STATE-INITIAL", "STATE-RESET",
                                "STATE-CLOSE", "STATE-NO-RACE", "STATE-NO-CONCURRENCY", "ZC-RETAIN", "ZC-FAILURE")


class StateMachine(RuleBasedStateMachine):
    """Operations on one State; after each, its values equal NumPy's and the manual loop's."""

    @initialize(data=st.data())
    def load(self, data):
        src = HypothesisSource(data.draw)
        self.sm = S.gen_state_model(src)
        self.runner = S.Runner(self.sm, S.initial_values(src, self.sm))

    def _apply(self, data, kind):
        self.runner.apply(S.gen_op(HypothesisSource(data.draw), self.sm, kind))

    @rule(data=st.data())
    def run(self, data):
        self._apply(data, "run")

    @rule()
    def values(self):
        self.runner.apply(S.Op("values"))

    @rule(data=st.data())
    def reset(self, data):
        self._apply(data, "reset")

    @precondition(lambda self: not self.runner.closed)
    @rule(data=st.data(), kind=st.sampled_from(["run_bad_shape", "run_cancelled", "run_wrong_dtype",
                                                  "run_override", "run_missing", "run_unknown"]))
    def failing_run(self, data, kind):
        self._apply(data, kind)

    @rule(data=st.data(), kind=st.sampled_from(["reset_missing", "reset_unknown", "reset_incompatible",
                                                  "reset_noncontiguous", "reset_borrow"]))
    def failing_reset(self, data, kind):
        self._apply(data, kind)

    @rule(data=st.data(), kind=st.sampled_from(["reenter_run", "reenter_reset", "reenter_close"]))
    def reentrant_call(self, data, kind):
        self._apply(data, kind)

    @rule()
    def close(self):
        self.runner.apply(S.Op("close"))

    @invariant()
    def retained_values_match(self):
        if hasattr(self, "runner"):
            self.runner.check_values()


TestStateMachine = StateMachine.TestCase
TestStateMachine.settings = profile(scale=2)


def test_generated_scripts_agree_with_the_manual_loop():
    for seed in range(40):
        S.run_script(S.gen_script(RandomSource(f"script-{seed}")))


def test_every_state_code_is_produced_by_a_script_operation():
    seen = set()
    for seed in range(150):
        script = S.gen_script(RandomSource(f"codes-{seed}"))
        runner = S.Runner(script.sm, script.initial)
        for op in script.ops:
            seen.add(runner.apply(op))
        seen.update(runner.inner_codes)
    assert {code.value for code in S.STATE_CODES} <= seen
    assert seen - {"ok"} <= {code.value for code in S.STATE_CODES}


def test_a_wrong_state_answer_is_detected():
    """The runner is not vacuous: a state whose retained value is tampered with is caught."""
    script = S.gen_script(RandomSource("tamper"))
    runner = S.Runner(script.sm, script.initial)
    runner.expected = {k: v + 1 for k, v in runner.expected.items()}
    with pytest.raises(S.Mismatch):
        runner.check_values()


@pytest.mark.parametrize("code", sorted(S.STATE_CODES, key=lambda c: c.value), ids=lambda c: c.value)
def test_state_codes_are_error_codes(code):
    assert code in ErrorCode
