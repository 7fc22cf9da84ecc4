"""What every adapter and the runner share: the profiles a runtime can claim and the three outcomes
besides a result (a rejection, "not supported", a problem of the suite itself). Kept apart from the
adapter protocol so adapters (the subprocess testee client among them) import it without a cycle."""

from __future__ import annotations

#: Profiles a runtime can claim; every case belongs to exactly one.
PROFILES = {
    "representation": "wire round trip, catalogue and identity, declarations, size arithmetic, payloads",
    "affine": "the closed affine branch decoded as DequantizeLinear",
    "structured": "structured decoding through registered decoders and generic field access",
    "external-data": "external payloads, extents and path safety",
    "bindings": "persistent binding declarations validated against the graph",
    "state": "state semantics: initial values, feeds, atomicity, reset/close, concurrency",
    "zero-copy": "buffer identity of retained, returned and forwarded values",
    "export": "export and rewrite of bindings and structured values",
    "kv-contiguous": "contiguous KV cache append, capacity and Attention",
    "kv-paged": "paged KV caches with per-block formats",
    "decode-e2e": "end-to-end repeated decode with independent states",
}


class Rejected(Exception):
    """The runtime rejected the input. ``code`` is the suite's error code, or None if unmapped.

    ``causes`` optionally names, as error codes, what made a wrapping failure happen (a run that fails
    with STATE_RUN_FAILED because an append was invalid names KV_SHAPE_MISMATCH, say).
    """

    def __init__(self, code: str | None, message: str = "", causes: tuple[str, ...] | list[str] = ()):
        self.code = code
        self.message = message
        self.causes = tuple(causes)
        super().__init__(f"[{code}] {message}" if code else message)


class NotSupported(Exception):
    """The runtime does not support what the case needs (a verdict, not a failure)."""


class SuiteError(Exception):
    """A problem with the suite itself (bad case, unknown adapter): never blamed on the adapter."""
