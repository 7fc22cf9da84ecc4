"""Starting the harness's Python child processes (campaign jobs, replay workers), all in one place.

A child runs in the directory the user started the command in, never in the package's own tree: paths
the user gave (a ``--testee ./build/testee`` command, a ``--subject my_adapter.py:Adapter`` file) then
mean in the child what they meant on the command line. The parent resolves its own path arguments before
any child starts (``reference_impl.cli_paths``), so children only ever see absolute paths from it.

The package is found through ``PYTHONPATH`` (the checkout this module belongs to comes first), and on
Python 3.11+ the child runs with ``-P``, so a directory that merely happens to be current (say, an
unpacked findings artifact) is not searched for modules.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_command(*arguments: str) -> list[str]:
    """A command line running this interpreter on ``arguments`` (``-m module ...`` or a script path)."""
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *safe_path, *arguments]


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, with ``extra`` on top and the package's root first on PYTHONPATH."""
    env = dict(os.environ)
    env.update(extra or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")]))
    return env


def start(command: Sequence[str], env: Mapping[str, str], **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen`` in the current directory. A ``cwd`` is refused: a child started elsewhere
    would read the user's relative paths against the wrong directory. Raises OSError when the command
    cannot be started."""
    if "cwd" in popen:
        raise TypeError("harness children run in the user's current directory; pass absolute paths instead")
    return subprocess.Popen(list(command), env=dict(env), **popen)


__all__ = ["PACKAGE_ROOT", "child_environment", "python_command", "start"]
