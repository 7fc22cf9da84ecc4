"""Command-line manners shared by every ``python -m`` entry point of the project.

A reader that stops early (``python -m conformance list | head``) closes the pipe; the next write then
raises ``BrokenPipeError``. That is the reader's choice, not an error of ours: the command ends quietly
with the status a shell gives a program stopped by SIGPIPE, instead of printing a traceback.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable

#: The exit status of a process killed by SIGPIPE, as shells report it.
BROKEN_PIPE_STATUS = 128 + signal.SIGPIPE


def quiet_broken_pipe(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a ``main`` returning an exit status so a closed standard output ends it quietly."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            status = main(*args, **kwargs)
            sys.stdout.flush()  # inside the try: buffered output may meet the closed pipe only here
            return status
        except BrokenPipeError:
            _discard_stdout()
            return BROKEN_PIPE_STATUS

    return wrapper


def _discard_stdout() -> None:
    """Point the standard output at /dev/null, so the interpreter's final flush does not fail again."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a descriptor
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, descriptor)
    os.close(devnull)
