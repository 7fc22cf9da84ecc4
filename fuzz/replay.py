"""Replaying inputs outside libFuzzer: in process (``replay``) or in a worker subprocess
(``ReplayWorker``) that survives hangs and native crashes of the code under test.

Worker protocol (``python -m fuzz.replay TARGET``): the parent writes a 4-byte little-endian length
and the input; the worker answers one JSON line ``{"ok": true}`` or ``{"kind", "signature", "detail"}``.
"""

from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import time

from fuzz.invariants import Finding


def replay(target: str, data: bytes) -> dict:
    """Run one input through a target in this process."""
    from fuzz.known_issues import known
    from fuzz.targets import load

    try:
        load(target).one_input(data)
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

    def __init__(self, target: str, timeout: float = 30.0, environment: dict | None = None):
        self.target = target
        self.timeout = timeout
        self.environment = dict(environment or {})  # e.g. the campaign's FUZZ_SUBJECT / FUZZ_TESTEE
        self.process: subprocess.Popen | None = None

    def _spawn(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, **self.environment)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "fuzz.replay", self.target], cwd=root, env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

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
                return json.loads(line)
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
