"""Structure-aware inputs -> verify -> decode.

The input drives the generators (``ByteSource``): the first choice picks a valid model (every value
decoded or read field by field and compared with the generator's expectation, then the model loaded
into the executor and a state made over its bindings, deep and diamond-shaped catalogues included) or
a near-valid one (the verdict must be exactly the broken rule's code). Byte mutations therefore land
on nearly valid models instead of parse errors.
"""

from __future__ import annotations

from fuzz import checks, gen, models, mutators
from fuzz.cases import FuzzCase, run_case, scratch
from fuzz.invariants import Finding, guarded, twice
from fuzz.source import ByteSource

INSTRUMENT = ("reference_impl", "fuzz.gen", "fuzz.mutators", "fuzz.layouts")
DICTIONARY = None  # inputs are generator choices, not model bytes: model tokens would not help
MAX_LEN = 8192


def _expect(fn, what: str):
    def run():
        try:
            return fn()
        except checks.Mismatch as mismatch:
            raise Finding("wrong-answer", str(mismatch), what) from None
    return guarded(run, what=what)


def build(data: bytes) -> tuple[gen.Generated, FuzzCase | None]:
    """The generated model and, for near-valid inputs, the broken case (None for valid inputs)."""
    src = ByteSource(data)
    near = src.integer(0, 3) != 0
    generated = models.gen_model(src, max_values=4)
    return generated, (mutators.near_valid(src, generated) if near else None)


def one_input(data: bytes) -> None:
    generated, case = guarded(lambda: build(data), what="generate")
    if case is None:
        base_dir = scratch().populate(generated.files)
        _expect(lambda: checks.check_valid(generated, base_dir), "valid")
        _expect(lambda: checks.check_runtime(generated, base_dir), "runtime")
        whole = FuzzCase(generated.model, "all", files=generated.files)
        twice(lambda: run_case(whole), what="valid-all")
        return
    verdict, _ = twice(lambda: run_case(case), what=f"near-valid {case.expected}")
    if verdict.code != case.expected:
        raise Finding("wrong-verdict", f"{case.rule}: expected {case.expected}, oracle says {verdict}",
                      f"near-valid:{case.expected}")


def seeds() -> list[bytes]:
    """Recorded choice streams that replay into valid and near-valid cases."""
    from fuzz.seedgen import structured_streams

    return structured_streams()
