"""An in-process adapter that kills its own process on one model, as a native runtime crashing would:
the reference adapter, except that decoding the model whose SHA-256 is ``CRASH_MODEL_SHA256`` calls
``os.abort()`` (``CRASH_HOW=abort``), raises SIGSEGV (``segv``) or holds the interpreter in native code for
30 s (``hold``). Loaded by tests/test_runner_isolation.py as ``--adapter tests/crashing_adapter.py:Crashing``
or passed to ``run()`` as an object."""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal

from conformance.adapters.reference import ReferenceAdapter


class Crashing(ReferenceAdapter):
    def __init__(self, model_sha256: str | None = None, how: str | None = None):
        super().__init__()
        self.model_sha256 = model_sha256 or os.environ.get("CRASH_MODEL_SHA256", "")
        self.how = how or os.environ.get("CRASH_HOW", "abort")

    def decode(self, model_bytes, value_name, base_dir):
        if hashlib.sha256(model_bytes).hexdigest() == self.model_sha256:
            if self.how == "abort":
                os.abort()
            elif self.how == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif self.how == "hold":
                ctypes.PyDLL(None).sleep(30)  # a PyDLL call keeps the interpreter lock: no thread can time it out
        return super().decode(model_bytes, value_name, base_dir)
