"""Cases in worker processes, so that a case killing its process (a signal or an abort in a native
runtime, an exit) fails alone, as ``crashed``, and the run goes on.

Workers are forked from the runner, so they share its loaded cases and any adapter object passed in.
Each is given one case at a time over a pipe, so the runner always knows which case a worker is running:
a worker that dies fails exactly that case, one that does not answer within the deadline is killed and
fails it as timed out, and a new worker takes the next case. (A ``ProcessPoolExecutor`` cannot do this:
one dead worker breaks the whole pool and loses which case killed it.) A crashing worker's Python stack
is kept (``faulthandler``) and goes into the case's traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from typing import IO, Any, NoReturn

from conformance.adapters import SuiteError
from conformance.cases import Case
from conformance.execute import CRASHED, FAILED, Result, abandoned_cases

#: What a worker runs: called once in the new process, it returns the function judging one case and a
#: clean-up called when the worker is done (or None).
Setup = Callable[[], tuple[Callable[[Case], Result], Callable[[], None] | None]]

_QUIT = -1
_STOP_GRACE = 10.0  # seconds a worker told to stop may take before it is killed
_TRACE_LIMIT = 16000  # characters of a crashed worker's stack kept in its case's traceback


def available() -> bool:
    """Worker processes need ``fork`` (they inherit the runner's cases and adapter object); macOS has
    it, but its system libraries do not survive it."""
    return hasattr(os, "fork") and sys.platform != "darwin"


@dataclass
class _Worker:
    pid: int
    conn: Connection
    crash_log: IO[bytes]
    ready: bool = False
    index: int | None = None
    started: float = 0.0


def run_cases(cases: list[Case], jobs: int, setup: Setup, deadline: float | None,
              on_result: Callable[[Result], None]) -> list[Result]:
    """Every case's result, in case order, run by up to ``jobs`` workers. A case whose worker dies is
    ``crashed``; one still running ``deadline`` seconds after it started (None: no limit) is killed and
    fails as timed out. A worker dying before it is ready is a SuiteError (the adapter cannot load)."""
    pool = _Pool(cases, max(1, jobs), setup, deadline, on_result)
    try:
        return pool.run()
    finally:
        pool.close()


class _Pool:
    def __init__(self, cases: list[Case], jobs: int, setup: Setup, deadline: float | None,
                 on_result: Callable[[Result], None]):
        self.cases = cases
        self.jobs = jobs
        self.setup = setup
        self.deadline = deadline
        self.on_result = on_result
        self.workers: dict[Connection, _Worker] = {}
        self.results: list[Result | None] = [None] * len(cases)
        self.pending = deque(range(len(cases)))

    def run(self) -> list[Result]:
        self._top_up()
        while self.workers:
            for conn in wait(list(self.workers), timeout=self._next_timeout()):
                worker = self.workers.get(conn)  # type: ignore[call-overload]
                if worker is not None:
                    self._receive(worker)
            self._expire(time.monotonic())
        return [result for result in self.results if result is not None]

    # ------------------------------------------------------------------------------- messages
    def _receive(self, worker: _Worker) -> None:
        try:
            kind, payload = worker.conn.recv()
        except (EOFError, OSError, pickle.UnpicklingError):
            self._died(worker)
            return
        if kind == "setup-error":
            self._retire(worker, kill=True)
            raise payload
        if kind == "result":
            index, result, spoiled = payload
            worker.index = None
            self._record(index, result)
            if spoiled:  # a timed-out case is still running on one of its threads: never reuse it
                self._retire(worker, kill=True)
                self._top_up()
                return
        worker.ready = True
        self._assign(worker)

    def _assign(self, worker: _Worker) -> None:
        if not self.pending:
            self._retire(worker, kill=False)
            return
        worker.index = self.pending.popleft()
        worker.started = time.monotonic()
        try:
            worker.conn.send(worker.index)
        except OSError:
            self._died(worker)

    def _record(self, index: int, result: Result) -> None:
        self.results[index] = result
        self.on_result(result)

    # ------------------------------------------------------------------------- deaths, hangs
    def _died(self, worker: _Worker) -> None:
        how = self._reap(worker)
        stack = _crash_stack(worker.crash_log)
        if not worker.ready:
            raise SuiteError(f"a worker process {how} while loading the adapter")
        if worker.index is not None:
            self._record(worker.index, _crashed(self.cases[worker.index], how, stack,
                                                time.monotonic() - worker.started))
        self._top_up()

    def _expire(self, now: float) -> None:
        if self.deadline is None:
            return
        for worker in list(self.workers.values()):
            if worker.index is not None and now - worker.started > self.deadline:
                index = worker.index
                self._retire(worker, kill=True)
                self._record(index, _hung(self.cases[index], self.deadline))
                self._top_up()

    def _next_timeout(self) -> float | None:
        running = [w.started for w in self.workers.values() if w.index is not None]
        if self.deadline is None or not running:
            return None
        return max(0.0, min(running) + self.deadline - time.monotonic()) + 0.01

    # ------------------------------------------------------------------------------ processes
    def _top_up(self) -> None:
        """Start workers until there are ``jobs`` of them or one for each case not yet given out."""
        starting = sum(not w.ready for w in self.workers.values())
        while len(self.workers) < self.jobs and starting < len(self.pending):
            self._spawn()
            starting += 1

    def _spawn(self) -> None:
        parent_end, child_end = Pipe()
        crash_log = tempfile.TemporaryFile()
        for stream in (sys.stdout, sys.stderr):  # or the child would write the parent's buffer again
            with contextlib.suppress(Exception):
                stream.flush()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError as error:
            parent_end.close()
            child_end.close()
            crash_log.close()
            raise SuiteError(f"cannot start a worker process: {error.strerror or error}") from None
        if pid == 0:
            parent_end.close()
            _child(parent, child_end, [w.conn for w in self.workers.values()], self.setup, self.cases, crash_log)
        child_end.close()
        self.workers[parent_end] = _Worker(pid, parent_end, crash_log)

    def _retire(self, worker: _Worker, kill: bool) -> None:
        """Stop ``worker``, asked to quit or killed, and reap it."""
        if not kill:
            with contextlib.suppress(OSError):
                worker.conn.send(_QUIT)
            kill = not worker.conn.poll(_STOP_GRACE)  # it closes its end when it exits
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
        self._reap(worker)
        worker.crash_log.close()

    def _reap(self, worker: _Worker) -> str:
        """Forget ``worker`` and wait for its process; returns how it ended."""
        self.workers.pop(worker.conn, None)
        worker.conn.close()
        _, status = os.waitpid(worker.pid, 0)
        return _status_words(os.waitstatus_to_exitcode(status))

    def close(self) -> None:
        """Kill every worker still running (an interrupted or failed run)."""
        for worker in list(self.workers.values()):
            self._retire(worker, kill=True)


# ----------------------------------------------------------------------------------------- the child
def _child(parent: int, conn: Connection, inherited: list[Connection], setup: Setup, cases: list[Case],
           crash_log: IO[bytes]) -> NoReturn:
    """The worker process: never returns (``os._exit``), whatever its cases do."""
    code = 0
    try:
        for other in inherited:  # the other workers' pipes: their ends must close when they die
            other.close()
        _die_with_parent(parent)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the runner's to handle
        faulthandler.enable(crash_log, all_threads=True)
        _serve(conn, setup, cases)
    except SystemExit as exc:  # an adapter called sys.exit(): the runner sees an exit
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the runner sees the exit status; the stack goes to stderr
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _serve(conn: Connection, setup: Setup, cases: list[Case]) -> None:
    try:
        run_one, cleanup = setup()
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which raises it
        conn.send(("setup-error", _picklable(exc)))
        return
    try:
        conn.send(("ready", None))
        spoiled_before = abandoned_cases()
        while True:
            try:
                index = conn.recv()
            except EOFError:  # the runner is gone
                return
            if index == _QUIT:
                return
            result = run_one(cases[index])
            spoiled = abandoned_cases() != spoiled_before
            conn.send(("result", (index, result, spoiled)))
            if spoiled:
                return
    finally:
        if cleanup is not None:
            cleanup()


def _picklable(exc: Exception) -> Exception:
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001 - any exception the adapter raised, told in one line
        return SuiteError(f"{type(exc).__name__}: {exc}")


def _die_with_parent(parent: int) -> None:
    """On Linux, the worker is killed when the runner dies, so no worker (nor its testee) outlives it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the runner died before the line above
        os._exit(1)


# ---------------------------------------------------------------------------------------- verdicts
def _status_words(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}" if code else "exited"


def _crash_stack(crash_log: IO[bytes]) -> str:
    """What faulthandler wrote when the worker crashed (its last ``_TRACE_LIMIT`` characters)."""
    try:
        crash_log.seek(0)
        return crash_log.read().decode("utf-8", "replace")[-_TRACE_LIMIT:]
    except (OSError, ValueError):
        return ""
    finally:
        crash_log.close()


def _crashed(case: Case, how: str, stack: str, duration: float) -> Result:
    result = Result(case.id, CRASHED, clauses=case.clauses, profile=case.profile, level=case.level,
                    expected=case.summary(), actual=f"the process running the case {how}", traceback=stack,
                    duration=duration)
    result.message = (f"crashed: the worker process running this case {how}; the run went on in a new worker "
                      "(the stack at the crash, when Python saw one, is in the traceback)")
    return result


def _hung(case: Case, deadline: float) -> Result:
    result = Result(case.id, FAILED, clauses=case.clauses, profile=case.profile, level=case.level,
                    expected=case.summary(), actual=f"no answer after {deadline:g} s", duration=deadline)
    result.message = (f"timed out: the worker process running this case did not answer within {deadline:g} s "
                      "(the case may hold the interpreter in native code); it was killed and the run went on")
    return result


def deadline_for(adapter: Any, timeout: float | None, grace: float = 10.0) -> float | None:
    """How long a worker may be silent on one case: the case's own timeout plus ``grace``, for in-process
    adapters (their timeout thread cannot stop native code that holds the interpreter). Adapters timing
    out their own calls (the testee) get no deadline: a case may make many calls."""
    if not timeout or getattr(adapter, "handles_timeouts", False):
        return None
    return timeout + grace
