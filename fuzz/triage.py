"""``python -m fuzz triage DIR``: replay findings, group them by signature (kind and the innermost
frame of the code under test), and minimize one input per group while it keeps that signature.

Minimization deletes chunks (ddmin), then zeroes bytes (for structure-aware targets a zero byte is the
smallest choice). Results: ``DIR/triage.json``, ``DIR/triage.md`` and ``DIR/minimized/<id>.bin``.
``DIR`` is treated as data from elsewhere: see ``fuzz.findings_io`` and ``fuzz.finding_env``.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import time
from collections.abc import Callable

from fuzz.confined import Confined
from fuzz.finding_env import directory_context, replay_environment
from fuzz.findings_io import FindingsDirectory, FindingsError
from fuzz.replay import ReplayWorker


def ddmin(data: bytes, keeps: Callable[[bytes], bool], budget_seconds: float = 60.0,
          max_tests: int = 4000) -> bytes:
    """A smaller input for which ``keeps`` still holds (delta debugging over bytes, then zeroing)."""
    deadline = time.monotonic() + budget_seconds
    tests = 0

    def check(candidate: bytes) -> bool:
        nonlocal tests
        tests += 1
        return keeps(candidate)

    granularity = 2
    while len(data) >= 2 and time.monotonic() < deadline and tests < max_tests:
        chunk = max(1, len(data) // granularity)
        reduced = False
        for start in range(0, len(data), chunk):
            candidate = data[:start] + data[start + chunk:]
            if candidate != data and check(candidate):
                data, reduced = candidate, True
                granularity = max(granularity - 1, 2)
                break
            if time.monotonic() >= deadline or tests >= max_tests:
                break
        if not reduced:
            if chunk == 1:
                break
            granularity = min(granularity * 2, len(data))
    for index in range(len(data)):  # smallest choices: zero every byte that can be zeroed
        if time.monotonic() >= deadline or tests >= max_tests:
            break
        if data[index]:
            candidate = data[:index] + b"\0" + data[index + 1:]
            if check(candidate):
                data = candidate
    return data


def _repeated(fld) -> bool:
    flag = getattr(fld, "is_repeated", None)
    return bool(flag) if flag is not None else fld.label == fld.LABEL_REPEATED


def _positions(message, out: list, path: tuple = ()) -> list:
    """Every removable spot of a message tree: (path, field name, index or None), depth first."""
    for fld, value in message.ListFields():
        if _repeated(fld):
            for index in range(len(value) - 1, -1, -1):
                out.append((path, fld.name, index))
                if fld.type == fld.TYPE_MESSAGE:
                    _positions(value[index], out, path + ((fld.name, index),))
        else:
            out.append((path, fld.name, None))
            if fld.type == fld.TYPE_MESSAGE:
                _positions(value, out, path + ((fld.name, None),))
    return out


def _remove(message, position) -> None:
    path, name, index = position
    for step, at in path:
        message = getattr(message, step) if at is None else getattr(message, step)[at]
    if index is None:
        message.ClearField(name)
    else:
        del getattr(message, name)[index]


def proto_reduce(data: bytes, keeps: Callable[[bytes], bool], budget_seconds: float = 30.0) -> bytes:
    """Remove fields and repeated elements of a parseable model while ``keeps`` holds."""
    from reference_impl import schema

    deadline = time.monotonic() + budget_seconds
    try:
        count = len(_positions(schema.parse_model(data), []))
    except Exception:  # noqa: BLE001 - not a model: nothing to reduce structurally
        return data
    k = 0
    while k < count and time.monotonic() < deadline:
        model = schema.parse_model(data)
        positions = _positions(model, [])
        if k >= len(positions):
            break
        _remove(model, positions[k])
        candidate = model.SerializeToString()
        if len(candidate) < len(data) and keeps(candidate):
            data, count = candidate, len(positions) - 1
        else:
            k += 1
    return data


def triage(directory: pathlib.Path, target: str | None = None, minimize: bool = True,
           budget_seconds: float = 60.0, subject: str | None = None, testee: str | None = None,
           fault: str | None = None) -> list[dict]:
    """Replay, group and minimize the findings of ``directory``; returns the reproducible groups.

    The directory is data (``fuzz.findings_io``): its recorded target and settings are validated, its
    recorded testee command is never run, and its results (``triage.json``, ``triage.md``,
    ``minimized/``) are written inside it only (``fuzz.confined``). Raises FindingsError, WriteError or
    ReplayError with a one-line message."""
    root = pathlib.Path(directory)
    with FindingsDirectory(root) as found:
        context = directory_context(found)
        target = target or context.target
        if not target:
            raise FindingsError(f"cannot tell which target the findings in {root} came from: pass --target")
        environment = replay_environment(context.settings, context.testee, subject, testee, fault)
        inputs = found.inputs()
    worker = ReplayWorker(target, environment=environment)
    groups: dict[str, dict] = {}
    with Confined.open(root, create=False) as out:
        try:
            for name, data in inputs:
                result = worker.run(data)
                signature = result.get("signature") or "not-reproducible"
                group = groups.setdefault(signature, {"signature": signature, "kind": result.get("kind", "none"),
                                                      "detail": result.get("detail", ""), "known": result.get("known"),
                                                      "files": [], "smallest": None})
                group["files"].append(name)
                if group["smallest"] is None or len(data) < len(group["smallest"]):
                    group["smallest"] = data
            with out.subdirectory("minimized") as minimized:
                for group in groups.values():
                    data = group.pop("smallest")
                    if minimize and group["signature"] != "not-reproducible":
                        def keeps(candidate: bytes, wanted: str = group["signature"]) -> bool:
                            return worker.run(candidate).get("signature") == wanted

                        if target == "verify":
                            data = proto_reduce(data, keeps, budget_seconds / 2)
                        data = ddmin(data, keeps, budget_seconds)
                    name = hashlib.sha256(target.encode() + data).hexdigest()[:12]
                    minimized.replace(f"{name}.bin", data)
                    group.update({"minimized": f"minimized/{name}.bin", "size": len(data), "target": target,
                                  "environment": environment})
        finally:
            worker.close()
        result = sorted(groups.values(), key=lambda g: -len(g["files"]))
        out.replace("triage.json", json.dumps(result, indent=1).encode())
        lines = [f"# Triage of {root} ({target})", "", "| findings | kind | origin | known issue | minimized |",
                 "| --- | --- | --- | --- | --- |"]
        for group in result:
            origin = group["signature"].split("|", 1)[-1]
            lines.append(f"| {len(group['files'])} | {group['kind']} | `{origin}` | {group['known'] or ''} | "
                         f"`{group['minimized']}` ({group['size']} bytes) |")
        lines += ["", *[f"- `{g['minimized']}`: {g['detail'][:300]}" for g in result]]
        out.replace("triage.md", ("\n".join(lines) + "\n").encode())
    for group in result:
        print(f"{len(group['files']):4d} x {group['signature']}  -> {group['minimized']} ({group['size']} bytes)")
    return [g for g in result if g["signature"] != "not-reproducible"]
