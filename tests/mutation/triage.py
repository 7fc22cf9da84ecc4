"""The committed triage of surviving mutants, checked against a mutmut run over ``reference_impl``.

docs/audit/mutation.md holds one line per mutant that survived the Required and Recommended cases, each
with its verdict: ``killed`` (by the named case, added since), ``equivalent`` (with the argument),
``permitted`` (with the spec sentence quoted) or ``missing case`` (a gap not yet closed). This module reads
those lines and the output of ``mutmut results --all true`` and says what is wrong:

* a mutant that survived, timed out or reached no case, with no triage line;
* a mutant the triage says is killed, which survived (the case no longer reaches it, or it was removed);
* a mutant the triage calls equivalent or permitted, which a case kills (the argument was wrong).

It also names the nightly shards (module globs, ``shards``) and runs the per-push sample (``sample``):
a few mutants the triage says are killed, mutated in a scratch copy of the checkout restricted to their
files, so the sample costs one stats pass of the cases and not the generation of every mutant.

Usage (from the repository root)::

    python tests/mutation/triage.py check RESULTS [--shard NAME]
    python tests/mutation/triage.py shards [NAME]
    python tests/mutation/triage.py sample [--count N]
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRIAGE_FILE = ROOT / "docs" / "audit" / "mutation.md"

KILLED, EQUIVALENT, PERMITTED, MISSING = "killed", "equivalent", "permitted", "missing case"
VERDICTS = (KILLED, EQUIVALENT, PERMITTED, MISSING)
#: mutmut statuses that count as a kill (a mutant that hangs fails the case on the suite's timeout, one that
#: crashes the interpreter fails the case it was running)
DETECTED = ("killed", "timeout", "caught by type check", "segfault")
#: mutmut statuses that leave a mutant alive: each needs a triage line
ALIVE = ("survived", "no tests", "suspicious")

#: The nightly shards: each is one job of ci/mutation-nightly.yml, running ``mutmut run`` on these globs.
#: Together they cover every mutated module (tests/test_mutation_triage.py checks both facts).
SHARDS: dict[str, tuple[str, ...]] = {
    "representation": ("reference_impl.bits.*", "reference_impl.decoders.*", "reference_impl.decode.*",
                       "reference_impl.dtypes.*", "reference_impl.errors.*",
                       "reference_impl.x_*"),
    "payload": ("reference_impl.payload.*", "reference_impl.tensors.*", "reference_impl.bindings.*"),
    "affine": ("reference_impl.affine.*",),
    "records": ("reference_impl.records.*", "reference_impl.graph_utils.*"),
    "schema": ("reference_impl.schema.*", "reference_impl.verifier.*", "reference_impl.clauses.*"),
    "structs": ("reference_impl.structs.*",),
    "values": ("reference_impl.values.*",),
    "state": ("reference_impl.state.*",),
    "executor": ("reference_impl.executor.*",),
    "kv-formats": ("reference_impl.kv.x_*", "reference_impl.kv.formats.*", "reference_impl.kv.storage.*",
                   "reference_impl.kv.measure.*", "reference_impl.kv.kernels.*"),
    "kv-contiguous": ("reference_impl.kv.contiguous.*", "reference_impl.kv.paged_attention.*"),
    "kv-paged": ("reference_impl.kv.paged.*",),
    "kv-attention": ("reference_impl.kv.attention.*",),
    "kv-qwen": ("reference_impl.kv.qwen.*",),
}

_LINE = re.compile(r"^- `(?P<name>reference_impl\.[\w.]+__mutmut_\d+)` (?P<verdict>killed|equivalent|permitted|"
                   r"missing case): (?P<why>\S.*)$")
_RESULT = re.compile(r"^\s*(?P<name>reference_impl\.[\w.]+__mutmut_\d+): (?P<status>.+?)\s*$")
_CASE_ID = re.compile(r"^`?(?P<case>(Required|Recommended)\.[\w.]+)`?")


@dataclass(frozen=True)
class Entry:
    """One triage line: the mutant, its verdict and why (a case ID, an argument or a quoted sentence)."""

    name: str
    verdict: str
    why: str

    @property
    def case_id(self) -> str:
        """The killing case of a ``killed`` entry ("" for the other verdicts)."""
        match = _CASE_ID.match(self.why) if self.verdict == KILLED else None
        return match.group("case") if match else ""


class TriageError(ValueError):
    """The triage file or a results file is malformed."""


def parse_triage(text: str) -> dict[str, Entry]:
    """The triage lines of ``text`` by mutant name (other lines are prose). A mutant listed twice, or a
    verdict without its reason (a ``killed`` line must start with the case ID, a ``permitted`` one must
    quote), is an error."""
    entries: dict[str, Entry] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("- `reference_impl."):
            continue
        match = _LINE.match(line)
        if not match:
            raise TriageError(f"line {number}: not `- `NAME` VERDICT: WHY` with VERDICT one of {VERDICTS}")
        entry = Entry(match.group("name"), match.group("verdict"), match.group("why"))
        if entry.name in entries:
            raise TriageError(f"line {number}: {entry.name} is triaged twice")
        if entry.verdict == KILLED and not entry.case_id:
            raise TriageError(f"line {number}: a killed mutant names its case (Required.* or Recommended.*)")
        if entry.verdict == PERMITTED and '"' not in entry.why:
            raise TriageError(f"line {number}: a permitted mutant quotes the spec sentence that permits it")
        entries[entry.name] = entry
    return entries


def parse_results(text: str) -> dict[str, str]:
    """Mutant name -> status, from the output of ``mutmut results --all true``."""
    results = {}
    for line in text.splitlines():
        match = _RESULT.match(line)
        if match:
            results[match.group("name")] = match.group("status")
    return results


def in_shard(name: str, globs: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in globs)


def problems(results: dict[str, str], triage: dict[str, Entry], globs: tuple[str, ...] | None = None) -> list[str]:
    """What makes the run disagree with the triage (empty when they agree)."""
    found = []
    for name, status in sorted(results.items()):
        entry = triage.get(name)
        if status in ALIVE and entry is None:
            found.append(f"{name} {status} and has no triage line (docs/audit/mutation.md)")
        elif status in ALIVE and entry.verdict == KILLED:
            found.append(f"{name} {status}, but the triage says {entry.case_id} kills it")
        elif status in DETECTED and entry is not None and entry.verdict in (EQUIVALENT, PERMITTED):
            found.append(f"{name} is {status}, but the triage calls it {entry.verdict}: remove that line")
        elif status in DETECTED and entry is not None and entry.verdict == MISSING:
            found.append(f"{name} is {status} now: turn its 'missing case' line into 'killed: <case ID>'")
        elif status not in ALIVE + DETECTED:
            found.append(f"{name}: {status} (the run did not check it)")
    if globs is not None:
        ran = set(results)
        found += [f"{name} is triaged but the run has no such mutant (renamed? stale line)"
                  for name in sorted(triage) if in_shard(name, globs) and name not in ran]
    return found


def score(results: dict[str, str], triage: dict[str, Entry]) -> dict[str, float | int]:
    """Figures of one run: mutants, killed by the cases, killed by the triage's new cases, equivalent or
    permitted (out of the denominator), still alive, and the score in percent."""
    counts = Counter(results.values())
    excused = sum(1 for name, status in results.items() if status in ALIVE and name in triage
                  and triage[name].verdict in (EQUIVALENT, PERMITTED))
    detected = sum(counts[s] for s in DETECTED)
    scored = len(results) - excused
    return {"mutants": len(results), "killed": counts["killed"], "timeout": counts["timeout"],
            "survived": counts["survived"], "no_tests": counts["no tests"], "excused": excused,
            "percent": round(100.0 * detected / scored, 2) if scored else 100.0}


# ------------------------------------------------------------------------------------------ sample
def sample(triage: dict[str, Entry], count: int) -> list[str]:
    """``count`` mutants the triage says are killed, spread evenly over the sorted list (deterministic)."""
    killed = sorted(name for name, entry in triage.items() if entry.verdict == KILLED)
    if len(killed) <= count:
        return killed
    step = len(killed) / count
    return [killed[int(index * step)] for index in range(count)]


def source_file(name: str) -> str:
    """The file a mutant lives in: ``reference_impl.kv.paged.x_f__mutmut_3`` -> ``reference_impl/kv/paged.py``
    (a method's mutant, ``...paged.xǁClassǁmethod__mutmut_1``, has no dot after its module either; a package
    root's mutants carry the package's name)."""
    module = name.split("__mutmut_")[0].rsplit(".", 1)[0].replace(".", "/")
    return module + ".py" if (ROOT / (module + ".py")).exists() else module + "/__init__.py"


def run_sample(names: list[str], workdir: Path) -> dict[str, str]:
    """Run mutmut on ``names`` in a scratch copy of the checkout that mutates only their files."""
    for part in ("reference_impl", "conformance", "corpus", "docs", "tests"):
        shutil.copytree(ROOT / part, workdir / part, ignore=shutil.ignore_patterns("__pycache__", "mutants"))
    files = sorted({source_file(name) for name in names})
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    only = "only_mutate = [" + ", ".join(f'"{f}"' for f in files) + "]\n"
    (workdir / "pyproject.toml").write_text(pyproject.replace("[tool.mutmut]\n", "[tool.mutmut]\n" + only, 1),
                                            encoding="utf-8")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([sys.executable, "-m", "mutmut", "run", *names], cwd=workdir, env=env, check=False,
                   stdout=subprocess.DEVNULL)
    listing = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=workdir, env=env,
                             check=True, capture_output=True, text=True).stdout
    return {name: status for name, status in parse_results(listing).items() if name in names}


# ------------------------------------------------------------------------------------------- CLI
def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise TriageError(f"cannot read {path}: {error.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="triage.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="compare a run's results with the committed triage")
    check.add_argument("results", type=Path, help="output of `mutmut results --all true`")
    check.add_argument("--shard", choices=sorted(SHARDS), help="the run covered only this shard")
    shards = commands.add_parser("shards", help="the nightly shards, or the globs of one")
    shards.add_argument("name", nargs="?", choices=sorted(SHARDS))
    sampled = commands.add_parser("sample", help="rerun a few mutants the triage says are killed")
    sampled.add_argument("--count", type=int, default=6)
    args = parser.parse_args(argv)
    try:
        if args.command == "shards":
            print("\n".join(SHARDS[args.name] if args.name else SHARDS))
            return 0
        triage = parse_triage(_read(TRIAGE_FILE))
        if args.command == "check":
            globs = SHARDS[args.shard] if args.shard else None
            results = parse_results(_read(args.results))
            if globs is not None:
                results = {name: status for name, status in results.items() if in_shard(name, globs)}
            if not results:
                raise TriageError(f"{args.results}: no mutant results (is it `mutmut results --all true` output?)")
            found = problems(results, triage, globs)
        else:
            names = sample(triage, args.count)
            if not names:
                print("mutation sample: the triage names no killed mutant")
                return 0
            with tempfile.TemporaryDirectory(prefix="mutation-sample-") as scratch:
                results = run_sample(names, Path(scratch))
            found = problems(results, triage) + [f"{name}: mutmut reported nothing" for name in names
                                                 if name not in results]
        figures = score(results, triage)
        print(f"mutation: {figures['mutants']} mutants, {figures['killed']} killed, {figures['timeout']} timed out, "
              f"{figures['survived']} survived, {figures['no_tests']} reached by no case, {figures['excused']} "
              f"equivalent or permitted; score {figures['percent']}%")
    except TriageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for problem in found:
        print(f"FAIL {problem}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
