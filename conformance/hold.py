"""Holding a call open without timing: a run parks at its model's ``Hold`` node until the runner
releases it.

Concurrency and cancellation cases need the first call to be *active* while the runner does something
else (issues a second call, requests cancellation). Sleeping and hoping the first call is still running
fails conforming runtimes on a loaded machine, so those cases put a ``Hold`` node in the model instead:

    node { op_type: "Hold" domain: "onnx_light.conformance" input: "x" output: "y" }

``Hold`` is an identity (``y`` is ``x``). On an ordinary run it passes straight through. On a run issued
with a hold (``run_held(feeds, hold)`` in process, ``Run.hold`` through the testee) the runtime's Hold
kernel calls ``hold.park()``, which tells the runner that the call is active and blocks until the runner
releases it. Before releasing, the runner may request cancellation: ``hold.park()`` then returns True,
and callbacks registered with ``hold.on_cancel`` (the runtime's own cancellation) have been called, as
when a caller cancels a call that is already running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

HOLD_DOMAIN = "onnx_light.conformance"
HOLD_OP = "Hold"


class Hold:
    """One held call. The runtime side calls ``park`` (and ``on_cancel``); the runner side waits with
    ``wait_parked``, then ``request_cancel`` and/or ``release``."""

    def __init__(self) -> None:
        self._parked = threading.Event()
        self._released = threading.Event()
        self._finished = threading.Event()
        self._lock = threading.Lock()
        self._on_cancel: list[Callable[[], None]] = []
        self.cancel_requested = False

    # ------------------------------------------------------------------------------- runtime side
    def park(self, timeout: float | None = None) -> bool:
        """Called by the Hold kernel: report the call active, wait for the release. Returns whether
        cancellation was requested meanwhile."""
        self._parked.set()
        self._released.wait(timeout)
        return self.cancel_requested

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Register how the runtime cancels this call (called if the runner requests cancellation)."""
        with self._lock:
            self._on_cancel.append(callback)
            requested = self.cancel_requested
        if requested:
            callback()

    def mark_parked(self) -> None:
        """For bridges (the testee adapter): the remote call reported that it parked."""
        self._parked.set()

    def finish(self) -> None:
        """The held call returned (whether or not it ever parked)."""
        self._finished.set()

    # -------------------------------------------------------------------------------- runner side
    @property
    def parked(self) -> bool:
        return self._parked.is_set()

    @property
    def released(self) -> bool:
        return self._released.is_set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def wait_parked(self, timeout: float | None = None) -> bool:
        return self._parked.wait(timeout)

    def wait_released(self, timeout: float | None = None) -> bool:
        return self._released.wait(timeout)

    def wait_parked_or_finished(self, timeout: float) -> bool:
        """True once the call parked; False if it finished first or ``timeout`` passed."""
        step = 0.01
        waited = 0.0
        while waited < timeout:
            if self._parked.wait(step):
                return True
            if self._finished.is_set():
                return self._parked.is_set()
            waited += step
            step = min(step * 2, 0.2)
        return self._parked.is_set()

    def request_cancel(self) -> None:
        with self._lock:
            self.cancel_requested = True
            callbacks = list(self._on_cancel)
        for callback in callbacks:
            callback()

    def release(self) -> None:
        self._released.set()


__all__ = ["HOLD_DOMAIN", "HOLD_OP", "Hold"]
