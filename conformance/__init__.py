"""The onnx-light conformance suite: cases, adapters, a subprocess testee protocol, runner and reports.

The suite version follows semver for the rules it interprets: a new case that checks an existing rule
is a minor change, a changed expectation is a major one. ``SPEC_REVISION`` names the revision of
"Custom, quantized, and persistent values" the cases check.
"""

from __future__ import annotations

from reference_impl.clauses import SPEC_NAME, SPEC_REVISION

SUITE_NAME = "onnx-light-conformance"
SUITE_VERSION = "4.0.0"  # 4.0: expectations widened (nested codecs may be refused as CONSUMER_MISSING) and unfair case models fixed; new cases for nested codecs, negative constant dims, STRING-logical state values and empty KV rows

__all__ = ["SPEC_NAME", "SPEC_REVISION", "SUITE_NAME", "SUITE_VERSION"]
