"""Soundness over the whole suite: "a Required case must fail every wrong runtime and no right one".

The five alternatives files each run their toy runtimes against the cases next to the choice they study.
Here every toy defined there is classified: ALLOWED (a runtime the spec allows: it passes every Required
case), PARTIAL (a runtime that claims only the behaviour its own test checks, e.g. the manual loop that
validates nothing: it passes the cases of that test) or FORBIDDEN (a wrong runtime: it fails a Required
case). A toy added to those files without a class here fails ``test_every_toy_is_classified``.

The default run gives each allowed toy the Required cases of the operations its overrides reach plus a
deterministic sample of the rest; ``ALTERNATIVES_ALL_FULL=1`` runs every allowed toy on every Required case.
"""

from __future__ import annotations

import inspect
import os
import zlib
from dataclasses import dataclass

import pytest
import test_alternatives_repr as repr_toys
import test_alternatives_state as state_toys
import test_alternatives_wire as wire_toys
import test_conformance_alternatives as alt
import test_kv_alternatives as kv

from conformance.audit.fault import Fault
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # decoded infinities and NaNs

CASES = load_cases()
REQUIRED = [case for case in CASES if case.level == "Required"]
FULL = os.environ.get("ALTERNATIVES_ALL_FULL") == "1"
#: the modules whose toys are classified here
MODULES = (alt, kv, repr_toys, state_toys, wire_toys)
#: one Required case in SAMPLE_EVERY outside the operations a toy overrides (by a stable hash of its ID)
SAMPLE_EVERY = 8


@dataclass(frozen=True)
class Toy:
    """A toy runtime: ``cls(*args)`` from one of MODULES."""

    cls: type
    args: tuple = ()
    #: PARTIAL: the cases (IDs, prefixes or globs) it claims; FORBIDDEN: cases of which it must fail one
    cases: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.cls.__name__ + (f"[{','.join(map(str, self.args))}]" if self.args else "")

    def make(self):
        return self.cls(*self.args)



ALLOWED = [Toy(cls) for cls in (
    alt.NewBufferIdentity, alt.FileFirst, alt.InitialNamesFirst, alt.ReversedBlockDecoder, alt.FlatOrBlocks,
    alt.DeclaredConstants, alt.DeclaredFieldsBlocksReversed, alt.MismatchIsMissingConsumer, alt.Waits,
    alt.IgnoresUnknownNames, alt.CloseIsFinal, alt.ReorderingLowering, alt.NoLowering, alt.ReEncodingWriter,
    alt.MultipliesInTheOutputPrecision, alt.AttentionInFloat64, alt.ChecksOnnxTyping, alt.KeepsLastEqualValue,
    alt.ExplicitOffsetWriter, alt.GuardsResetClosePerModel, alt.MapsExternalOnLoad, alt.OldStyleWriter,
    alt.ColumnMajorLogicalShape, alt.RefOnlyIdFirst, alt.DeclaredScaleType, alt.ChecksCodecFunctions,
    alt.EntriesFileFirst, alt.InitializerDefaultsBoundInputs, alt.MinusOneMaxTokensUnlimited,
    alt.ChecksBindingNamesFirst, alt.TypesOperatorsAtLoad, alt.Int4BlockReadByField,
    kv.StrictOwnership, kv.TightGrowth, kv.RewritesOpenBlock, kv.LongTiles, kv.CompletesCancelledRuns,
    kv.ConvertsCallerBlocks, kv.RoleWithoutExtensions, kv.OtherCheckOrder, kv.ValidatesCachesAtOpen,
    repr_toys.ChecksLoopArity, repr_toys.PinsNestedCodecsAsMismatch, repr_toys.ChecksScaleRankBeforeAxis,
    state_toys.BlockDecoderCheckedOutputs, state_toys.ChecksPlainOnnx, state_toys.RefusesMisplacedCategories,
    state_toys.SerializesRunsAcrossStates, state_toys.LeavesFeedTypesToKernels,
    wire_toys.InvokesDeclaredDecoder, wire_toys.RefusesEncodedTensorOutputs, wire_toys.DiscardsValueInfo,
    wire_toys.ExplicitDefaultsWriter, repr_toys.PinsNestedCodecs)]

#: (allowed toy, Required case) pairs that still fail, and why: each an open question about a case
ALLOWED_FAILURES: dict[tuple[str, str], str] = {}

#: the manual loop validates nothing beyond the executor: it claims only the behaviours its tests study
_LOOP_CLAIMS = (*alt.STRIDED, *alt.STRIDED_STRUCT, "Required.ZeroCopy.ReadOnly.ReferencedBuffersNeverWritten",
                "Required.ZeroCopy.Outstanding", "Required.State.Cancel.DuringRunAllOldOrAllNew")
PARTIAL = [
    Toy(alt.LoopAdapter, cases=_LOOP_CLAIMS),
    Toy(alt.LoopAdapter, ("ignore-cancel",), cases=("Required.State.Cancel.DuringRunAllOldOrAllNew",)),
]

FORBIDDEN = [
    Toy(alt.LoopAdapter, ("copy",), cases=(*alt.STRIDED, "Required.ZeroCopy.Retain.NextCallReceivesSameBuffer")),
    Toy(alt.LoopAdapter, ("in-place",), cases=("Required.ZeroCopy.ReadOnly.ReferencedBuffersNeverWritten",)),
    Toy(alt.LoopAdapter, ("partial-cancel",), cases=("Required.State.Cancel.DuringRunAllOldOrAllNew",)),
    Toy(alt.RefusesUnbinding, cases=("Required.Export.Rewrite.ExplicitUnbindKeepsOtherBindings",)),
    Toy(alt.LosesBindings, cases=("Required.Export.Rewrite.CopyKeepsBindings",)),
    Toy(alt.Races, cases=("Required.State.Concurrency.ResetDuringRunDoesNotRace",
                          "Required.State.Concurrency.CloseDuringRunDoesNotRace")),
    Toy(alt.ScaleTypeIsOutputType, cases=("Required.Affine.Scale.OutputDtype_Float16FromFloatScale",)),
    Toy(alt.RegisteredScalePosition, cases=("Required.Structured.Consumers.ChangedFieldTypeNeedsNewId",)),
    Toy(kv.CopiesEveryAppend, cases=("Required.KV.CapacityReuse.NoWholeCacheCopyPerAppend",)),
    Toy(kv.CopiesWholePagedCache, cases=("Required.KV.PagedBounded.AppendWritesAtMostOneBlock",)),
    Toy(kv.WholeCacheTile, cases=("Required.KV.PagedBounded.DenseWorkspaceHoldsNoWholeCache",)),
    Toy(kv.CancelledButPublished, cases=("Required.KV.Contiguous.CancelledAppendLeavesCache",)),
    Toy(kv.ConvertsLossily, cases=("Required.KV.PagedFormats.Int4KeysUint4Values",)),
    Toy(kv.MisnamesBlockErrors, cases=("Required.KV.PagedBlockTable.ValidBeyondSlots",)),
]

#: classes of those modules that are no runtime of their own, and why
NOT_RUNTIMES = {
    alt.LoopState: "LoopAdapter's state", alt.WaitingState: "Waits' state", alt.RacingState: "Races' state",
    alt._DropsUnknownFeeds: "IgnoresUnknownNames' state", alt._StrictClose: "CloseIsFinal's state",
    alt._SavedModelRewriter: "a base of the writers", alt._ModelGuard: "GuardsResetClosePerModel's lock",
    alt._WaitsForModelRuns: "GuardsResetClosePerModel's state",
    alt._ResetWithDefaults: "InitializerDefaultsBoundInputs' state",
    alt.WithoutBaseDir: "a runner's view of an adapter (withholding base_dir), not a runtime",
    kv._Adapter: "a base of the KV toys", kv._StrictState: "StrictOwnership's state",
    state_toys._OutputsChecked: "BlockDecoderCheckedOutputs' executor",
    state_toys._QueuedRuns: "SerializesRunsAcrossStates' state",
    state_toys._FeedsByName: "LeavesFeedTypesToKernels' executor",
}

#: the case operations each adapter method is called for (conformance/execute.py; a state trace may export
#: or rewrite its model first)
_OPS_OF = {"verify": {"verify"}, "decode": {"decode"}, "read_fields": {"fields"}, "open_state": {"state"},
           "executor_kernels": {"state"}, "roundtrip": {"roundtrip"}, "export": {"export", "state"},
           "rewrite": {"rewrite", "state"}}


def _ops(toy: Toy) -> set[str]:
    """The case operations the toy's own code reaches (every one for a patching Fault)."""
    if issubclass(toy.cls, Fault):
        return {case.op for case in REQUIRED}
    ops: set[str] = set()
    for klass in toy.cls.__mro__:
        if klass.__module__ in {module.__name__ for module in MODULES}:
            for name in vars(klass):
                ops |= _OPS_OF.get(name, set())
            if "swapped" in vars(klass) or "during" in vars(klass):
                ops.add("state")
    return ops


def _sampled(case_id: str) -> bool:
    return zlib.crc32(case_id.encode()) % SAMPLE_EVERY == 0


def _chosen(toy: Toy) -> list:
    if FULL:
        return REQUIRED
    ops = _ops(toy)
    return [case for case in REQUIRED if case.op in ops or _sampled(case.id)]


def _failures(adapter, cases) -> dict[str, str]:
    results = {case.id: run_case(case, adapter, timeout=120) for case in cases}
    return {case_id: r.message for case_id, r in results.items() if r.verdict != PASSED}


def _fast_independent_timeout(toy: Toy, monkeypatch) -> None:
    """The per-model guard waits out the whole independence timeout on the other-state cases."""
    if toy.cls is alt.GuardsResetClosePerModel:
        from conformance import trace

        monkeypatch.setattr(trace, "INDEPENDENT_TIMEOUT", 0.5)


# ------------------------------------------------------------------------------------ classification
def _defined_classes() -> set[type]:
    return {cls for module in MODULES for _, cls in inspect.getmembers(module, inspect.isclass)
            if cls.__module__ == module.__name__}


def test_every_toy_is_classified():
    classified = [toy.cls for toy in (*ALLOWED, *PARTIAL, *FORBIDDEN)]
    assert not set(classified) & set(NOT_RUNTIMES)
    missing = _defined_classes() - set(classified) - set(NOT_RUNTIMES)
    assert not missing, f"classify these toys in tests/test_alternatives_all.py: {sorted(c.__name__ for c in missing)}"
    labels = [toy.label for toy in (*ALLOWED, *PARTIAL, *FORBIDDEN)]
    assert len(labels) == len(set(labels))


def test_allowed_failures_name_allowed_toys_and_required_cases():
    ids, labels = {case.id for case in REQUIRED}, {toy.label for toy in ALLOWED}
    for label, case_id in ALLOWED_FAILURES:
        assert label in labels and case_id in ids, (label, case_id)


def test_every_allowed_toy_overrides_something_the_cases_call():
    for toy in ALLOWED:
        assert _ops(toy), f"{toy.label} overrides nothing the cases call"


# ------------------------------------------------------------------------------------------ verdicts
@pytest.mark.parametrize("toy", ALLOWED, ids=lambda toy: toy.label)
def test_an_allowed_runtime_passes_every_required_case(toy: Toy, monkeypatch):
    _fast_independent_timeout(toy, monkeypatch)
    failed = _failures(toy.make(), _chosen(toy))
    unexpected = {case_id: message for case_id, message in failed.items()
                  if (toy.label, case_id) not in ALLOWED_FAILURES}
    assert not unexpected, (toy.label, len(unexpected), unexpected)
    fixed = {case.id for case in _chosen(toy) if (toy.label, case.id) in ALLOWED_FAILURES} - set(failed)
    assert not fixed, f"{toy.label} now passes {sorted(fixed)}: remove them from ALLOWED_FAILURES"


@pytest.mark.parametrize("toy", PARTIAL, ids=lambda toy: toy.label)
def test_a_partial_runtime_passes_the_cases_it_claims(toy: Toy):
    chosen = select(REQUIRED, list(toy.cases))
    assert chosen, toy.cases
    assert not _failures(toy.make(), chosen)


@pytest.mark.parametrize("toy", FORBIDDEN, ids=lambda toy: toy.label)
def test_a_forbidden_runtime_fails_a_required_case(toy: Toy):
    chosen = select(REQUIRED, list(toy.cases))
    assert chosen, toy.cases
    verdicts = {case.id: run_case(case, toy.make(), timeout=120).verdict for case in chosen}
    assert FAILED in verdicts.values(), (toy.label, verdicts)

