"""The atheris entry point shared by the ``*_fuzzer.py`` files.

``fuzz_main(name)`` instruments the target's packages, caps the address space (after libFuzzer has
set itself up) and hands ``one_input`` to libFuzzer. Set ``FUZZ_STATS_FILE`` to get a JSON line of
executions per second for progress reporting (``python -m fuzz run`` does). A subject that cannot be
set up ends the process with ``SUBJECT_UNAVAILABLE_STATUS`` and one ``ERROR:`` line, never a finding.
"""

from __future__ import annotations

import json
import os
import sys
import time

#: Exit status of a fuzzer whose subject cannot be set up (libFuzzer uses 1, 70 and 77 for its own).
SUBJECT_UNAVAILABLE_STATUS = 3


class _Stats:
    """Executions counted in process; written at most once a second (cheap enough for 10k exec/s)."""

    def __init__(self, path: str | None):
        self.path = path
        self.count = 0
        self.known: dict[str, int] = {}
        self.start = time.monotonic()
        self.last = self.start

    def tick(self) -> None:
        self.count += 1
        if self.path and (self.count & 63) == 0:
            now = time.monotonic()
            if now - self.last >= 1.0:
                self.last = now
                self.write(now)

    def write(self, now: float) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"t": round(now - self.start, 3), "execs": self.count,
                                     "known": self.known}) + "\n")


def fuzz_main(name: str, argv: list[str] | None = None) -> None:
    import atheris

    from fuzz.targets import TARGETS

    if name not in TARGETS:
        raise SystemExit(f"unknown target {name}")
    instrumented = _instrument(name)
    with atheris.instrument_imports(include=list(instrumented), exclude=["fuzz.harness"]):
        from fuzz.targets import load

        target = load(name)
        _import_all(instrumented)
    from fuzz.invariants import Finding, SubjectUnavailable
    from fuzz.known_issues import known

    stats = _Stats(os.environ.get("FUZZ_STATS_FILE"))
    capped = []

    def test_one_input(data: bytes) -> None:
        if not capped:
            from fuzz.invariants import cap_address_space

            cap_address_space(int(os.environ.get("FUZZ_ADDRESS_SPACE_MB", "4096")))
            capped.append(True)
        stats.tick()
        try:
            target.one_input(data)
        except SubjectUnavailable as error:
            # Not a finding: no libFuzzer artifact (os._exit skips its exit handler), one ERROR line.
            sys.stderr.write(f"ERROR: the subject cannot be set up: {error}\n")
            sys.stderr.flush()
            os._exit(SUBJECT_UNAVAILABLE_STATUS)
        except Finding as finding:
            issue = known(finding.signature)
            if issue is None:
                raise
            stats.known[issue] = stats.known.get(issue, 0) + 1

    args = list(sys.argv if argv is None else argv)
    if not any(a.startswith("-max_len=") for a in args):
        args.append(f"-max_len={target.MAX_LEN}")
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


def _import_all(prefixes: tuple[str, ...]) -> list[str]:
    """Import every module under ``prefixes`` now, inside the instrumentation block, and return their
    names. Targets import much of what they exercise lazily (inside ``one_input``); a module first
    imported there would run uninstrumented and give libFuzzer no coverage to steer by."""
    import importlib
    import pkgutil

    names = []
    for prefix in prefixes:
        names.append(prefix)
        package = importlib.import_module(prefix)
        for info in pkgutil.walk_packages(getattr(package, "__path__", ()), f"{prefix}."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue  # a command line, not a library module
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional peer's adapter without its runtime: never run here either
                continue
            names.append(info.name)
    return names


def _instrument(name: str) -> tuple[str, ...]:
    """Packages to instrument, read from the target module's source without importing it uninstrumented.

    The source comes through the import system, so this also works inside a one-file fuzzer executable
    (ci/clusterfuzzlite/build.sh bundles the targets' sources for this).
    """
    import ast
    import importlib.util
    import pathlib

    module = f"fuzz.targets.{name}"
    spec = importlib.util.find_spec(module)
    source = None
    if spec is not None:
        reader = getattr(spec.loader, "get_source", None)  # an import hook (pytest's, say) may lack it
        if reader is not None:
            source = reader(module)
        elif spec.origin and pathlib.Path(spec.origin).is_file():
            source = pathlib.Path(spec.origin).read_text()
    if source is None:
        raise SystemExit(f"the source of {module} is not available: its INSTRUMENT list cannot be read")
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "INSTRUMENT" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ("reference_impl",)
