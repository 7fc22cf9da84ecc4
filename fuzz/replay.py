"""Replaying inputs outside libFuzzer: in process (``replay``) or in a worker subprocess
(``ReplayWorker``) that survives hangs and native crashes of the code under test.

Worker protocol (``python -m fuzz.replay TARGET``): the parent writes a 4-byte little-endian length
and the input; the worker answers one JSON line ``{"ok": true}`` or ``{"kind", "signature", "detail"}``.
The worker starts through ``fuzz.children`` (in the user's current directory) with this process's
environment plus only the replay settings ``fuzz.finding_env`` allows.
"""

from __future__ import annotations

import json
import select
import struct
import subprocess
import sys
import time
from collections.abc import Mapping

from fuzz.children import child_environment, python_command, start
from fuzz.errors import CommandError
from fuzz.finding_env import check_replay_environment
from fuzz.invariants import Finding, SubjectUnavailable

#: The ``kind`` of a replay result whose subject could not be set up (no verdict on the input).
UNUSABLE_SUBJECT = "unusable-subject"


class ReplayError(CommandError):
    """Replaying cannot start: the subject cannot be set up. The message is one line."""


def replay(target: str, data: bytes) -> dict:
    """Run one input through a target in this process."""
    from fuzz.known_issues import known
    from fuzz.targets import load

    try:
        load(target).one_input(data)
    except SubjectUnavailable as error:
        return {"ok": False, "kind": UNUSABLE_SUBJECT, "signature": None, "detail": str(error), "known": None}
    except Finding as finding:
        return {"ok": False, "kind": finding.kind, "signature": finding.signature, "detail": finding.detail,
                "known": known(finding.signature)}
    return {"ok": True}


def _serve(target: str) -> None:
    from fuzz.targets import load

    load(target)
    stdin, stdout = sys.stdin.buffer, sys.stdout
    while True:
        header = stdin.read(4)
        if len(header) < 4:
            return
        (size,) = struct.unpack("<I", header)
        data = stdin.read(size)
        stdout.write(json.dumps(replay(target, data)) + "\n")
        stdout.flush()


class ReplayWorker:
    """A replay subprocess; a hang (``timeout`` seconds) or a crash is reported, then it restarts."""

    def __init__(self, target: str, timeout: float = 30.0, environment: Mapping[str, str] | None = None):
        from fuzz.targets import TARGETS

        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; targets are {', '.join(TARGETS)}")
        self.target = target
        self.timeout = timeout
        self.environment = dict(environment or {})  # validated settings (fuzz.finding_env) only
        check_replay_environment(self.environment)
        self.process: subprocess.Popen | None = None

    def _spawn(self) -> None:
        try:
            self.process = start(python_command("-m", "fuzz.replay", self.target),
                                 child_environment(self.environment), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError as error:
            raise ReplayError(f"cannot start the replay worker: {error.strerror or error}") from None

    def run(self, data: bytes) -> dict:
        if self.process is None or self.process.poll() is not None:
            self._spawn()
        process = self.process
        try:
            process.stdin.write(struct.pack("<I", len(data)) + data)
            process.stdin.flush()
        except BrokenPipeError:
            return self._died()
        deadline = time.monotonic() + self.timeout
        while True:
            ready, _, _ = select.select([process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                line = process.stdout.readline()
                if not line:
                    return self._died()
                result = json.loads(line)
                if result.get("kind") == UNUSABLE_SUBJECT:
                    self.close()
                    raise ReplayError(f"the subject cannot be set up: {result.get('detail')}")
                return result
            if time.monotonic() >= deadline:
                self.close()
                return {"ok": False, "kind": "timeout", "signature": "timeout|replay",
                        "detail": f"no answer within {self.timeout}s", "known": None}

    def _died(self) -> dict:
        code = self.process.wait()
        self.process = None
        return {"ok": False, "kind": "crash", "signature": f"crash|exit {code}",
                "detail": f"the replay process died with status {code}", "known": None}

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


if __name__ == "__main__":
    _serve(sys.argv[1])
