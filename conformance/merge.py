"""One report and one certification bundle from a sharded run (``run --shard i/n`` on n machines).

The shards are accepted only when together they are exactly one run: each shard directory is a bundle
that checks out on its own (and, with ``--trusted-key``, is signed by a trusted key); all were made by
the same suite version and spec revision, on the same corpus (the one merging), by the same adapter,
with the same selection, waivers and shard count; every index 1..n is there once; and every case of the
selection is in exactly one shard. The merged report and bundle are written by the same code as an
unsharded run's, so ``verify-bundle`` checks them alike, and
the merged bundle certifies a profile only when the shards together cover its whole corpus selection.
Shards are untrusted input: their files are read through ``conformance.bundle_files`` and every field
is checked for its kind before use.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from conformance import bundle, reports
from conformance.bundle_files import BundleError, expect, field, read_json
from conformance.cases import load_cases, select
from conformance.execute import Result
from conformance.runner import RunInfo

#: The recorded facts every shard must share, as (what it is, path into the shard's manifest).
SHARED = (
    ("suite version", ("suite", "version")),
    ("spec revision", ("spec", "revision")),
    ("corpus digest", ("corpus", "sha256")),
    ("corpus definitions digest", ("corpus", "files_sha256")),
    ("adapter name", ("adapter", "name")),
    ("adapter version", ("adapter", "version")),
    ("adapter identity", ("adapter", "identity")),
    ("claimed profiles", ("adapter", "profiles")),
    ("case patterns", ("selection", "cases")),
    ("level", ("selection", "level")),
    ("profiles selected", ("selection", "profile")),
)
#: The fields of a per-case result a shard's results.json must give, with their kinds.
RESULT_FIELDS = {"id": str, "verdict": str, "message": str, "expected": str, "actual": str, "detail": str,
                 "traceback": str, "duration": (int, float), "clauses": list, "profile": str, "level": str,
                 "code_checked": (bool, type(None)), "expected_failure": bool, "operators": dict}


@dataclass
class Shard:
    """One shard's report directory, as recorded by ``run --shard i/n``."""

    directory: pathlib.Path
    run: dict  # the shard's manifest: suite, spec, corpus, adapter, selection
    results: list[Result]
    problems: list[str]  # failure-list problems the shard's run reported
    waivers: list[dict]
    index: int
    count: int

    @property
    def name(self) -> str:
        return f"shard {self.index}/{self.count} ({self.directory})"


class MergeRejected(Exception):
    """The shards do not form one run; ``problems`` says why (nothing was written)."""

    def __init__(self, problems: list[str]):
        super().__init__(f"{len(problems)} problem(s)")
        self.problems = problems


def merge(directories: list[str | pathlib.Path], report_dir: str | pathlib.Path,
          corpus: str | None = None, trusted_keys: list | None = None) -> tuple[list[Result], RunInfo, list[str]]:
    """Check the shards and write the merged report and bundle to ``report_dir``. Returns the merged
    results (in selection order), the run's identity and the failure-list problems; raises
    ``MergeRejected`` when the shards are not one run. With ``trusted_keys`` every shard must carry a
    signature by one of them; without, the merged manifest records that the shards were not authenticated."""
    shards, problems = [], []
    for directory in directories:
        shard, found = read_shard(pathlib.Path(directory), corpus, trusted_keys)
        problems += found
        if shard is not None:
            shards.append(shard)
    if not problems:
        problems = check(shards, corpus)
    if problems:
        raise MergeRejected(problems)
    results = _in_selection_order(shards, corpus)
    info = _merged_info(shards, len(results), bool(trusted_keys))
    failure_problems = list(dict.fromkeys(p for shard in shards for p in shard.problems))
    directory = reports.write_all(report_dir, results, info, failure_problems, bundle.statuses(results, info, corpus))
    bundle.write(directory, results, info, shards[0].waivers, corpus)
    return results, info, failure_problems


def read_shard(directory: pathlib.Path, corpus: str | None = None,
               trusted_keys: list | None = None) -> tuple[Shard | None, list[str]]:
    """The shard in ``directory``, or the reasons it cannot be one (its bundle does not check out or is not
    signed by a trusted key, or it was not a sharded run). Nothing in it is trusted before it is checked."""
    try:
        if trusted_keys:
            outcome = bundle.verify(directory, corpus, trusted_keys=trusted_keys)
            manifest, problems = outcome.manifest, outcome.problems
        else:
            manifest, problems = bundle.check(directory, corpus)
        if problems:
            return None, [f"{directory}: {problem}" for problem in problems]
        recorded = read_json(directory, "results.json")
        expect(recorded, dict, "results.json")
        results = [_result(entry, f"results.json.results[{n}]")
                   for n, entry in enumerate(field(recorded, "results", list, "results.json"))]
        listed = field(recorded, "problems", list, "results.json") if "problems" in recorded else []
        failure_problems = [expect(p, str, "results.json.problems[]") for p in listed]
        run = {key: manifest[key] for key in ("suite", "spec", "corpus", "adapter", "selection", "machine")
               if key in manifest}
        run["started"] = _number(field(recorded, "run", dict, "results.json").get("started"))
        run["duration"] = _number(recorded["run"].get("duration"))
    except BundleError as error:
        return None, [f"{directory}: {error}"]
    index, _, count = str(run["selection"].get("shard") or "").partition("/")
    if not (index.strip().isdigit() and count.strip().isdigit() and len(index) < 6 and len(count) < 6):
        return None, [f"{directory}: not a shard (its run had no --shard i/n)"]
    return Shard(directory, run, results, failure_problems, manifest["waivers"], int(index), int(count)), []


def _result(entry, where: str) -> Result:
    expect(entry, dict, where)
    values = {}
    for key, kind in RESULT_FIELDS.items():
        if key in entry:
            values[key] = expect(entry[key], kind, f"{where}.{key}")
    for key in ("id", "verdict"):
        field(entry, key, str, where)
    return Result(**values)


def _number(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def check(shards: list[Shard], corpus: str | None = None) -> list[str]:
    """Every reason the shards are not exactly one run (empty when they are)."""
    if not shards:
        return ["no shard to merge"]
    problems = _mismatches(shards, corpus)
    if problems:  # indexes and cases are only comparable between shards of one run
        return problems
    count = shards[0].count
    by_index: dict[int, list[Shard]] = {}
    for shard in shards:
        by_index.setdefault(shard.index, []).append(shard)
    for index in range(1, count + 1):
        group = by_index.get(index, [])
        if not group:
            problems.append(f"shard {index}/{count} is missing")
        elif len(group) > 1:
            problems.append(f"shard {index}/{count} is given {len(group)} times: "
                            + ", ".join(str(s.directory) for s in group))
    problems += [f"shard {index}/{count} is outside 1..{count} ({group[0].directory})"
                 for index, group in sorted(by_index.items()) if not 1 <= index <= count]
    if problems:
        return problems
    owners: dict[str, list[Shard]] = {}
    for shard in shards:
        for result in shard.results:
            owners.setdefault(result.id, []).append(shard)
    selection = [case.id for case in _selection(shards[0], corpus)]
    for case_id in selection:
        holders = owners.get(case_id, [])
        if not holders:
            problems.append(f"{case_id} of the selection is in no shard")
        elif len(holders) > 1:
            problems.append(f"{case_id} is in more than one shard: {', '.join(s.name for s in holders)}")
    chosen = set(selection)
    problems += [f"{case_id} is not in the selection ({owners[case_id][0].name})"
                 for case_id in sorted(owners) if case_id not in chosen]
    return problems


def _mismatches(shards: list[Shard], corpus: str | None) -> list[str]:
    problems = []
    for what, path in SHARED:
        values = {shard.name: _get(shard.run, path) for shard in shards}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            problems.append(f"the shards differ in {what}: "
                            + "; ".join(f"{name}: {value}" for name, value in values.items()))
    counts = {shard.count for shard in shards}
    if len(counts) > 1:
        problems.append("the shards differ in shard count: " + "; ".join(shard.name for shard in shards))
    if len({json.dumps(shard.waivers, sort_keys=True) for shard in shards}) > 1:
        problems.append("the shards ran with different failure lists (waivers differ)")
    return problems


def _get(run: dict, path: tuple[str, ...]):
    value = run
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _selection(shard: Shard, corpus: str | None) -> list:
    """The whole selection the shards were cut from, recomputed from the local corpus."""
    chosen = shard.run["selection"]
    return select(load_cases(corpus), chosen.get("cases"), chosen.get("level"),
                  set(chosen["profile"]) if chosen.get("profile") else None)


def _in_selection_order(shards: list[Shard], corpus: str | None) -> list[Result]:
    by_id = {result.id: result for shard in shards for result in shard.results}
    return [by_id[case.id] for case in _selection(shards[0], corpus)]


def _merged_info(shards: list[Shard], count: int, authenticated: bool) -> RunInfo:
    """The identity of the whole run: shared facts from the shards, each shard's own run beside them."""
    first = sorted(shards, key=lambda s: s.index)[0].run
    selection = {key: value for key, value in first["selection"].items() if key != "full"}
    selection.update({"shard": None, "count": count, "shards_authenticated": authenticated, "shards": [
        {"shard": f"{s.index}/{s.count}", "count": len(s.results), "started": s.run.get("started"),
         "duration": s.run.get("duration"), "machine": s.run.get("machine")}
        for s in sorted(shards, key=lambda s: s.index)]})
    return RunInfo(suite=first["suite"], spec=first["spec"], adapter=first["adapter"], selection=selection,
                   platform={},  # each shard's machine is in selection["shards"]
                   started=min(s.run.get("started", 0.0) for s in shards),
                   duration=max(s.run.get("duration", 0.0) for s in shards))
