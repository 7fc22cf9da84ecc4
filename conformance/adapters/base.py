"""What every adapter and the runner share: the profiles a runtime can claim and the three outcomes
besides a result (a rejection, "not supported", a problem of the suite itself). Kept apart from the
adapter protocol so adapters (the subprocess testee client among them) import it without a cycle."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

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
    "measured": "cost observed from outside the runtime: allocations around a call, retained buffers' addresses, "
                "opens of an external payload file",
}
#: Profiles whose cases observe the runtime's own process, so only an in-process adapter can take them: a
#: testee's claim to them is dropped by the runner (the protocol cannot show another process's allocations).
IN_PROCESS_PROFILES = frozenset({"measured"})


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


def accepted_keywords(method: Callable[..., Any], **keywords: Any) -> dict[str, Any]:
    """The ``keywords`` that ``method`` accepts: by name, or all of them when it takes ``**kwargs``.

    Arguments added to an adapter method after adapters were written (``base_dir`` of ``roundtrip``,
    ``export`` and ``rewrite``) are passed only to a method whose signature names them, so an adapter
    written before keeps working unchanged. A signature that cannot be read accepts none.
    """
    function = getattr(method, "__func__", method)
    try:
        names = _keyword_names(function)
    except TypeError:  # an unhashable callable object: read it without the cache
        names = _keyword_names.__wrapped__(function)
    if names is None:
        return dict(keywords)
    return {name: value for name, value in keywords.items() if name in names}


@functools.lru_cache(maxsize=1024)
def _keyword_names(function: Callable[..., Any]) -> frozenset[str] | None:
    """The names ``function`` accepts as keywords, or None when it takes ``**kwargs`` (read once per
    function: adapters' methods are few and fixed)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters
                     if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))
