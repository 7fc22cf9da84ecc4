"""pytest plugin: ``pytest --conformance-adapter=SPEC`` runs conformance cases as test items.

Registered through the ``pytest11`` entry point (or ``-p conformance.pytest_plugin``). Without the
option it does nothing. Items are collected deterministically, so ``-n auto`` (xdist) distributes them.
Options: ``--conformance-adapter``, ``--conformance-testee``, ``--conformance-cases`` (repeatable),
``--conformance-level``, ``--conformance-profile`` (repeatable), ``--conformance-only`` (deselect the
project's other tests).
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("conformance", "onnx-light conformance cases")
    group.addoption("--conformance-adapter", help="run conformance cases on this adapter (name, module:attr, "
                                                  "path/to/file.py:attr)")
    group.addoption("--conformance-testee", help="run conformance cases through this testee command line")
    group.addoption("--conformance-cases", action="append", help="case ID, prefix or glob")
    group.addoption("--conformance-level", choices=["Required", "Recommended"])
    group.addoption("--conformance-profile", action="append")
    group.addoption("--conformance-only", action="store_true", help="collect only conformance cases")
    group.addoption("--conformance-timeout", type=float, default=30.0)


def _enabled(config) -> bool:
    return bool(config.getoption("--conformance-adapter") or config.getoption("--conformance-testee"))


class ConformanceCollector(pytest.Collector):
    """The conformance cases selected by the options, one item each."""

    def collect(self):
        from conformance.cases import load_cases, select

        config = self.config
        cases = select(load_cases(), config.getoption("--conformance-cases"), config.getoption("--conformance-level"),
                       set(config.getoption("--conformance-profile") or []) or None)
        for case in cases:
            yield CaseItem.from_parent(self, name=case.id, case=case)


class CaseItem(pytest.Item):
    def __init__(self, *, case, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        for clause in case.clauses:
            self.add_marker(pytest.mark.clause(clause))

    def runtest(self) -> None:
        from conformance.execute import FAILED, NOT_SUPPORTED, run_case

        result = run_case(self.case, _adapter(self.config), timeout=self.config.getoption("--conformance-timeout"))
        self.user_properties.append(("verdict", result.verdict))
        if result.verdict == NOT_SUPPORTED:
            pytest.skip(f"not supported: {result.message}")
        if result.verdict == FAILED:
            raise CaseFailed(result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            result = excinfo.value.result
            lines = [f"{result.id}: {result.message}", f"  clauses:  {', '.join(result.clauses)}",
                     f"  expected: {result.expected}", f"  actual:   {result.actual}"]
            if result.detail:
                lines.append(f"  detail:   {result.detail}")
            if result.traceback:
                lines.append(result.traceback)
            return "\n".join(lines)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return f"corpus/{self.case.source}", None, self.case.id


class CaseFailed(Exception):
    def __init__(self, result):
        super().__init__(result.message)
        self.result = result


_ADAPTERS: dict = {}


def _adapter(config):
    key = (config.getoption("--conformance-adapter"), config.getoption("--conformance-testee"))
    if key not in _ADAPTERS:
        from conformance.adapters import load_adapter

        _ADAPTERS[key] = load_adapter(key[0], key[1], config.getoption("--conformance-timeout"))
    return _ADAPTERS[key]


def pytest_collection_modifyitems(session, config, items) -> None:
    if not _enabled(config):
        return
    collector = ConformanceCollector.from_parent(session, name="conformance")
    cases = list(collector.collect())
    if config.getoption("--conformance-only"):
        config.hook.pytest_deselected(items=list(items))
        items[:] = cases
    else:
        items.extend(cases)


def pytest_unconfigure(config) -> None:
    for adapter in _ADAPTERS.values():
        if hasattr(adapter, "shutdown"):
            adapter.shutdown()
    _ADAPTERS.clear()
