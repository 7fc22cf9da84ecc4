"""The generated tables of the C++ SDK's guide (conformance/sdk/cpp/README.md): which check gives which
error code (from reference_impl/errors.py, with the profiles whose cases expect each code) and which
protocol requests each profile's cases send and which operators the models of each profile's state traces
run (from the case corpus). A vendor reads them instead of the suite's sources; ``--check`` (run by
tests/test_sdk_tables.py) fails when the README is stale.

``python -m conformance.sdk_tables`` prints the tables, ``--write`` rewrites them in the README between
their markers, ``--check`` exits 1 when the README differs.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator

from conformance.adapters import PROFILES
from conformance.cases import Case, load_cases
from conformance.generated_section import replace_section
from reference_impl.errors import ErrorCode

README = pathlib.Path(__file__).resolve().parent / "sdk" / "cpp" / "README.md"
TABLES = ("codes", "requests", "operators")

#: The request a case of each non-state operation sends (docs/testee-protocol.md, "Operations").
OPERATION_REQUESTS = {"verify": "verify", "decode": "decode", "fields": "read_fields", "roundtrip": "roundtrip",
                      "export": "export", "rewrite": "rewrite"}
#: Requests in protocol order, as the table lists them.
REQUEST_ORDER = ("verify", "decode", "read_fields", "roundtrip", "export", "rewrite", "open_state", "run",
                 "run.cancelled", "run.hold", "hold", "values", "reset", "close", "counters")
#: Step keys holding further steps (a held run's branches, an optional step's outcomes).
NESTED_LISTS = ("rejected", "waited", "cancelled", "completed", "if_accepted", "if_rejected")


def _substeps(step: dict) -> Iterator[dict]:
    """The steps inside a step, each with its op (a held run's run and second call, a repeated step)."""
    if step.get("op") == "held":
        yield {**step["run"], "op": "run"}
        if "second" in step:
            yield {"op": "run", **step["second"]}
    if step.get("op") == "repeat":
        yield {"op": "run", **step["step"]}
    if step.get("op") in ("allocations", "file_opens"):  # a measured call (conformance/measured.py)
        yield {"op": "run", **step["call"]}
    for key in NESTED_LISTS:
        for inner in step.get(key, []):
            yield {"op": "run", **inner}


def _walk(steps: Iterable[dict]) -> Iterator[dict]:
    for step in steps:
        yield step
        yield from _walk(_substeps(step))


def _step_requests(step: dict) -> set[str]:
    op = step.get("op")
    if op == "open":
        return {"open_state"} | {key for key in ("rewrite", "export") if key in step}
    if op == "run":
        return {"run.cancelled" if step.get("cancel") else "run"}
    if op == "held":
        return {"run.hold", "hold"}
    if op == "lowered":
        return {"export"}
    if op in ("values", "reset", "close", "counters"):
        return {op}
    if op in ("verify", "decode"):  # a measured call of a trace (conformance/measured.py)
        return {OPERATION_REQUESTS[op]}
    return set()


def case_requests(case: Case) -> set[str]:
    """The protocol requests running ``case`` sends besides hello (a state trace's handles are closed at
    its end)."""
    if case.op != "state":
        return {OPERATION_REQUESTS[case.op]}
    found = {"close"}
    for step in _walk(case.state_steps()):
        found |= _step_requests(step)
    return found


def case_codes(case: Case) -> set[str]:
    """Every error code ``case`` expects or accepts, anywhere in it."""
    found: set[str] = set()

    def add(entry: dict) -> None:
        if isinstance(entry.get("error"), str) and entry["error"]:
            found.add(entry["error"])
        for key in ("also", "cause", "may_reject"):
            value = entry.get(key) or []
            found.update([value] if isinstance(value, str) else value)

    add(case.expect)
    for step in _walk(case.state_steps()):
        add(step)
    return found


def codes_table(cases: Iterable[Case]) -> str:
    """code | check that gives it | clause | profiles whose cases expect it."""
    profiles: dict[str, set[str]] = defaultdict(set)
    for case in cases:
        for code in case_codes(case):
            profiles[code].add(case.profile)
    lines = ["| code | the check that gives it | clause | profiles whose cases expect it |",
             "| --- | --- | --- | --- |"]
    for code in ErrorCode:
        expected = ", ".join(sorted(profiles.get(code.value, ()))) or "-"
        lines.append(f"| `{code.value}` | {code.summary} | {code.clause} | {expected} |")
    return "\n".join(lines) + "\n"


def requests_table(cases: Iterable[Case]) -> str:
    """profile | cases (Required) | requests its cases send, besides hello."""
    requests: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for case in cases:
        requests[case.profile] |= case_requests(case)
        counts[case.profile][0] += 1
        counts[case.profile][1] += case.level == "Required"
    lines = ["| profile | cases (Required) | requests its cases send, besides `hello` |", "| --- | --- | --- |"]
    for profile in sorted(PROFILES):
        sent = ", ".join(f"`{name}`" for name in REQUEST_ORDER if name in requests[profile]) or "-"
        total, required = counts[profile]
        lines.append(f"| `{profile}` | {total} ({required}) | {sent} |")
    return "\n".join(lines) + "\n"


#: How a call of a model-local function (a FunctionProto of the model) is listed.
LOCAL_FUNCTION = "model-local functions"


def _graph_nodes(nodes: Iterable) -> Iterator:
    """Every node, with the nodes of its control-flow bodies."""
    for node in nodes:
        yield node
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _graph_nodes(attribute.g.node)
            for graph in attribute.graphs:
                yield from _graph_nodes(graph.node)


def case_operators(case: Case) -> set[str]:
    """The operators running ``case``'s model needs (state traces only: other operations never run a
    model): standard operators by op_type, others as ``domain::op_type``; calls of the model's own
    functions are listed once as LOCAL_FUNCTION."""
    if case.op != "state":
        return set()
    from reference_impl import schema

    try:
        model = schema.parse_model(case.model_bytes())
    except Exception:  # noqa: BLE001 - an unparsable model runs no operator
        return set()
    local = {(function.domain, function.name) for function in model.functions}
    found: set[str] = set()
    for node in _graph_nodes([*model.graph.node, *(n for f in model.functions for n in f.node)]):
        if (node.domain, node.op_type) in local:
            found.add(LOCAL_FUNCTION)
        else:
            found.add(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}")
    return found


def _operator_cell(name: str) -> str:
    """An operator as the table shows it: code-formatted, with the role it plays (docs/testee-protocol.md)."""
    from conformance.operators import ROLES

    if name == LOCAL_FUNCTION:
        return name
    roles = {f"{role.domain}::{role.op_type}": role.name for role in ROLES.values() if role.domain}
    return f"`{name}` (role `{roles[name]}`)" if name in roles else f"`{name}`"


def operators_table(cases: Iterable[Case]) -> str:
    """profile | operators its state traces' models run."""
    operators: dict[str, set[str]] = defaultdict(set)
    for case in cases:
        operators[case.profile] |= case_operators(case)
    lines = ["| profile | operators the models of its state traces run |", "| --- | --- |"]
    for profile in sorted(PROFILES):
        names = sorted(operators[profile], key=lambda name: ("::" in name or name == LOCAL_FUNCTION, name))
        lines.append(f"| `{profile}` | {', '.join(_operator_cell(name) for name in names) or '-'} |")
    return "\n".join(lines) + "\n"


def render(cases: Iterable[Case] | None = None) -> dict[str, str]:
    """Each generated table of the README by its marker name."""
    found = list(load_cases() if cases is None else cases)
    return {"codes": codes_table(found), "requests": requests_table(found), "operators": operators_table(found)}


def _markers(name: str) -> tuple[str, str]:
    return (f"<!-- generated by python -m conformance.sdk_tables: {name} -->",
            f"<!-- end of generated {name} -->")


def updated(text: str, tables: dict[str, str]) -> str:
    """``text`` with every table between its markers replaced; a missing marker is a SuiteError."""
    from conformance.adapters import SuiteError

    for name, table in tables.items():
        start, end = _markers(name)
        try:
            text = replace_section(text, start, end, table)
        except ValueError:
            raise SuiteError(f"{README} has no markers for the {name} table ({start!r} ... {end!r})") from None
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.sdk_tables", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the tables in conformance/sdk/cpp/README.md")
    action.add_argument("--check", action="store_true", help="exit 1 when the README's tables are stale")
    args = parser.parse_args(argv)
    tables = render()
    if not (args.write or args.check):
        for name in TABLES:
            sys.stdout.write(tables[name] + "\n")
        return 0
    from conformance.adapters import SuiteError

    try:
        text = README.read_text()
        fresh = updated(text, tables)
    except (OSError, SuiteError) as error:
        print(f"conformance.sdk_tables: {error}", file=sys.stderr)
        return 2
    if args.write:
        README.write_text(fresh)
    elif fresh != text:
        print(f"{README} is stale: python -m conformance.sdk_tables --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
