"""Oracle issues found by fuzzing, reported, and kept as strict-xfail regressions until fixed.

Campaigns would otherwise stop on the same known finding over and over. A finding whose signature
(kind, file and function of its origin) is listed here is counted in the campaign report as a
known-issue hit instead of ending the job; ``FUZZ_STRICT=1`` turns that off. Generator variants that
are known to hit an issue (and would hang or fail every test run) are only produced with
``FUZZ_PROBE_KNOWN=1``.

When the oracle is fixed, the regression in ``corpus/regressions/oracle/`` starts passing, its strict
xfail fails, and the entry here must be removed.
"""

from __future__ import annotations

import os

# Issues fixed in the oracle are removed from here; their regressions stay in corpus/regressions/.
# An empty signature tuple documents an open issue without suppressing its findings. Every issue found
# so far has been fixed.
ISSUES: dict[str, tuple[str, tuple[str, ...]]] = {}


def _function_signature(signature: str) -> str:
    """kind|path:line:function -> kind|path:function (line numbers move when the code changes)."""
    kind, _, where = signature.partition("|")
    parts = where.split(":")
    if len(parts) == 3:
        where = f"{parts[0]}:{parts[2]}"
    return f"{kind}|{where}"


_BY_SIGNATURE = {sig: name for name, (_, sigs) in ISSUES.items() for sig in sigs}


def known(signature: str) -> str | None:
    """The known issue a finding signature belongs to, or None."""
    if os.environ.get("FUZZ_STRICT") == "1":
        return None
    return _BY_SIGNATURE.get(_function_signature(signature))


def probe_known() -> bool:
    """Whether generators should also produce inputs that hit known oracle issues."""
    # On by default: every issue once gated here has been fixed. FUZZ_PROBE_KNOWN=0 turns it off.
    return os.environ.get("FUZZ_PROBE_KNOWN", "1") == "1"
