"""The onnx-light conformance suite: cases, adapters, a subprocess testee protocol, runner and reports.

The suite version follows semver for the rules it interprets: a new case that checks an existing rule
is a minor change, a changed expectation is a major one. ``SPEC_REVISION`` names the revision of
"Custom, quantized, and persistent values" the cases check.
"""

from __future__ import annotations

from reference_impl.clauses import SPEC_NAME, SPEC_REVISION

SUITE_NAME = "onnx-light-conformance"
SUITE_VERSION = "7.1.0"  # 7.1: cases from the payload, records and kv-attention mutation shards (see CHANGELOG.md)

__all__ = ["SPEC_NAME", "SPEC_REVISION", "SUITE_NAME", "SUITE_VERSION"]
