"""A testee that writes text on stdout (a print, a log line) is told so: the runner names the text it
read where a frame's length should be, instead of reporting a frame of a billion bytes."""

from __future__ import annotations

import sys

import pytest

from conformance.adapters import testee_client as runner_side

PRINTS = f"{sys.executable} -c \"import time; print('hello from the testee', flush=True); time.sleep(60)\""


def test_a_testee_printing_on_stdout_is_told_it_wrote_text():
    with pytest.raises(runner_side.TesteeUnavailable) as info:
        runner_side.TesteeAdapter(PRINTS, timeout=10)
    message = str(info.value)
    assert "testee wrote text on stdout (first bytes: 'hell')" in message
    assert "1819043176" not in message and "\n" not in message
