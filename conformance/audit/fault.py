"""The base of every built-in fault: the reference adapter with exactly one realistic bug.

A fault subclasses ``Fault`` and injects its bug through one of a few clean seams, never by changing
the oracle's default behaviour or a case's expectation:

* ``patches()``: attributes of ``reference_impl`` replaced while the fault's own calls run (a wrapper
  around the original, or a small replacement written the way the buggy runtime would write it);
* ``transform(model, base_dir)``: what the buggy runtime effectively reads, for bugs that ignore part
  of the input (a skipped check behaves like the oracle on the input with that part dropped);
* ``precheck(model, base_dir)``: an extra rejection, for bugs that refuse what the spec allows;
* ``on_save(model)``: what the runtime writes when it saves a model (round trip, onnx-light export);
* overriding adapter or state-handle methods, for bugs in the runtime's own state management.

Patches are installed for the duration of each adapter or state-handle call and removed afterwards
(reference-counted, so the two overlapping calls of a concurrency case share one installation). Only
one fault's patches can be active in a process at a time; the audit runs faults one after another in
each worker process. Caches the oracle builds once (decoder registries) are rebuilt under a fault whose
patches reach the code that builds them, as the buggy runtime would have built them.

Every fault also runs behind the subprocess testee:
``python -m conformance.testee --adapter conformance.audit.faults.zero_copy:InitialValuesCopied``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from conformance.adapters.reference import ReferenceAdapter, ReferenceState
from reference_impl import ContractError, schema

_ABSENT = object()

#: ``reference_impl.decode`` the module (the package re-exports a function of the same name)
decode_module = importlib.import_module("reference_impl.decode")


@dataclass(frozen=True)
class Patch:
    """Replace ``target.name`` (or ``target[name]`` for a dict) with ``value`` while a fault is active.

    A module attribute is replaced in every ``reference_impl`` module that imported the same object
    under the same name (``from reference_impl.payload import open_payload``), so the fault reaches
    every caller; ``aliases=False`` replaces it in ``target`` only (a bug in one caller's code path)."""

    target: Any
    name: str
    value: Any
    aliases: bool = True

    def expand(self) -> list[Patch]:
        if not self.aliases or not isinstance(self.target, types.ModuleType):
            return [self]
        aliases = _aliases(self.target, self.name, self._get())
        return [self] + [Patch(module, self.name, self.value) for module in aliases]

    def _get(self):
        return self.target[self.name] if isinstance(self.target, dict) else getattr(self.target, self.name)

    def _own(self) -> bool:
        """Whether the name is stored on the target itself (not resolved by a lazy package's
        ``__getattr__`` or inherited from a base class)."""
        if isinstance(self.target, dict):
            return self.name in self.target
        return self.name in vars(self.target)

    def _remove(self) -> None:
        if isinstance(self.target, dict):
            self.target.pop(self.name, None)
        else:
            with contextlib.suppress(AttributeError):  # a read-only property ignored the patch
                delattr(self.target, self.name)

    def _set(self, value) -> None:
        if isinstance(self.target, dict):
            self.target[self.name] = value
        else:
            setattr(self.target, self.name, value)


#: (module, name) -> (modules loaded, original, the other reference_impl modules holding the original):
#: faults install their patches on every adapter call, and scanning every loaded module each time was a
#: fifth of an audit's run time. Valid while no module was loaded since and the original is the same.
_ALIAS_CACHE: dict[tuple[int, str], tuple[int, Any, list]] = {}


def _aliases(target: types.ModuleType, name: str, original: Any) -> list:
    key, loaded = (id(target), name), len(sys.modules)
    cached = _ALIAS_CACHE.get(key)
    if cached is not None and cached[0] == loaded and cached[1] is original:
        return cached[2]
    found = [module for key_, module in sorted(sys.modules.items())
             if key_.startswith("reference_impl") and module is not target
             and getattr(module, name, _ABSENT) is original]
    _ALIAS_CACHE[key] = (loaded, original, found)
    return found


def wrap(target: Any, name: str, make: Callable[[Callable], Callable], aliases: bool = True) -> Patch:
    """A patch replacing ``target.name`` by ``make(original)``."""
    original = target[name] if isinstance(target, dict) else getattr(target, name)
    return Patch(target, name, make(original), aliases)


def returning(target: Any, name: str, edit: Callable, aliases: bool = True) -> Patch:
    """A patch making ``target.name`` return ``edit(result, *args, **kwargs)`` for the call's arguments: a result
    read or changed the way the buggy runtime does."""
    def make(original):
        def edited(*args, **kwargs):
            return edit(original(*args, **kwargs), *args, **kwargs)
        return edited
    return wrap(target, name, make, aliases)


def skip(target: Any, name: str, *codes: str, returns: Any = None) -> Patch:
    """The function ``target.name`` without the checks that raise ``codes``: when one of them fires,
    the function gives up silently and returns ``returns`` (what a runtime lacking the check does). A
    callable ``returns`` gets the call's arguments by name (defaults applied) and computes the result."""
    def make(original):
        signature = inspect.signature(original)

        def skipping(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            except ContractError as error:
                if error.code.value not in codes:
                    raise
                if not callable(returns):
                    return returns
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                return returns(bound.arguments)
        return skipping
    return wrap(target, name, make)


def enclosing_depth(arguments: dict) -> int:
    """For ``skip(..., returns=enclosing_depth)`` on the type checks that return the deepest level they
    reached: a skipped check reaches no deeper than where it started."""
    return arguments["depth"]


#: why a bug that changes a buffer after the runtime handed it out cannot be seen through the testee
TESTEE_COPIES_RETURNED_VALUES = (
    "the testee protocol copies every returned value into its response, so a case's later check reads the "
    "client's copy; seeing a buffer changed after it was handed out needs a request that reads a reported "
    "buffer (by buffer_id) back from the testee")


# --------------------------------------------------------------------------------- built caches
#: Module-level caches the oracle builds once from its own code (decoder registries, the KV catalogue).
#: A runtime with a bug in the code that builds them would have built them with the bug, so a fault whose
#: patches reach that code gets fresh caches, built under its patches, for the duration of its calls.
_CACHES = (("reference_impl.decode", "_DEFAULT_REGISTRY"), ("reference_impl.kv.paged", "_CATALOGUE"),
           ("reference_impl.kv.paged", "_REGISTRY"))
#: the functions through which cases reach those caches (a fault resetting them can act wherever they run)
_CACHE_ACCESSORS = (("reference_impl.decode", "_registry"), ("reference_impl.kv.paged", "_bindings"))


@functools.cache
def cache_builder_codes() -> frozenset:
    """The code objects run while the cached registries and catalogues are built (traced once)."""
    from reference_impl.decoders import default_registry
    from reference_impl.kv.formats import kv_catalogue, kv_registry

    seen: set = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code)

    sys.setprofile(profile)
    try:
        default_registry()
        kv_catalogue()
        kv_registry()
    finally:
        sys.setprofile(None)
    return frozenset(seen)


def patch_codes(patches: list[Patch]) -> tuple[frozenset, bool]:
    """The code objects of the functions patches replace, and whether one replaces a non-function."""
    codes = {getattr(patch._get(), "__code__", None) for patch in patches}
    return frozenset(codes - {None}), None in codes


def cache_resets(patches: list[Patch]) -> list[Patch]:
    """Patches emptying the built caches when ``patches`` reach the code that builds them."""
    codes, _ = patch_codes(patches)
    if codes.isdisjoint(cache_builder_codes()):
        return []
    return [Patch(importlib.import_module(module), name, None) for module, name in _CACHES]


def cache_accessor_codes() -> frozenset:
    return frozenset(getattr(importlib.import_module(module), name).__code__ for module, name in _CACHE_ACCESSORS)


class _Installer:
    """Process-wide bookkeeping of the one fault whose patches are installed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: Fault | None = None
        self.depth = 0
        self.saved: list[tuple[Patch, Any]] = []

    def enter(self, fault: Fault) -> None:
        with self.lock:
            if self.owner is fault:
                self.depth += 1
                return
            if self.owner is not None:
                raise RuntimeError(f"fault {fault.fault_id}: the patches of {self.owner.fault_id} are still active")
            patches = [concrete for patch in fault.patches() for concrete in patch.expand()]
            patches += cache_resets(patches)
            # every original is read before anything is replaced: a package that resolves a name lazily
            # from its submodule would otherwise report the submodule's already patched function
            self.saved = [(patch, patch._get(), patch._own()) for patch in patches]
            for patch in patches:
                patch._set(patch.value)
            self.owner, self.depth = fault, 1

    def exit(self, fault: Fault) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth:
                return
            for patch, original, own in reversed(self.saved):
                if own:
                    patch._set(original)
                else:
                    patch._remove()  # it was resolved lazily or inherited: leave no copy behind
            self.saved, self.owner = [], None

    @property
    def idle(self) -> bool:
        with self.lock:
            return self.owner is None


INSTALLER = _Installer()


class Fault(ReferenceAdapter):
    """The reference adapter with one injected bug. Subclasses set the class attributes and a seam."""

    #: stable ID, ``CLAUSE-ID.short-name``
    fault_id: ClassVar[str] = ""
    #: the clauses the bug breaks (the first is the one it is written for)
    clauses: ClassVar[tuple[str, ...]] = ()
    #: a boundary fault: a rule's edge (widest fields, ties, last elements, defaults, nesting)
    boundary: ClassVar[bool] = False
    #: non-empty when no case can catch the fault yet: what the missing case would need to check
    pending: ClassVar[str] = ""
    #: the reference handle being wrapped while ``make_state`` runs (FaultState takes its Hold slot)
    opened: ReferenceState | None = None
    #: non-empty when the testee protocol cannot show the bug (why); the audit through the testee then
    #: reports the fault instead of failing on it
    testee_blind: ClassVar[str] = ""
    #: apply transform/precheck on roundtrip, export and rewrite too (read paths only by default)
    prepares_writes: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return f"reference with fault {self.fault_id}"

    # ----------------------------------------------------------------------------------- seams
    def patches(self) -> list[Patch]:
        return []

    def transform(self, model, base_dir: str | None) -> None:
        """Edit the parsed model in place: what the buggy runtime effectively reads."""

    def precheck(self, model, base_dir: str | None) -> None:
        """Raise a ContractError for inputs the buggy runtime wrongly refuses."""

    def make_state(self, handle: ReferenceState) -> ReferenceState:
        """The state handle the buggy runtime hands out (default: the reference's, with patches)."""
        return FaultState(handle.state, self)

    def on_save(self, model) -> None:
        """Edit, in place, a model the runtime saves explicitly (round trip, export to onnx-light)."""

    # ------------------------------------------------------------------------------- plumbing
    @contextlib.contextmanager
    def injected(self) -> Iterator[None]:
        INSTALLER.enter(self)
        try:
            yield
        finally:
            INSTALLER.exit(self)

    def _edits_model(self) -> bool:
        own = type(self)
        return own.transform is not Fault.transform or own.precheck is not Fault.precheck

    def prepare(self, model_bytes: bytes, base_dir: str | None) -> bytes:
        """The model bytes after ``precheck`` and ``transform`` (unchanged when the fault has neither)."""
        if not self._edits_model():
            return model_bytes
        try:
            model = schema.parse_model(model_bytes)
        except Exception:  # noqa: BLE001 - unparsable bytes go to the oracle, which classifies them
            return model_bytes
        self.precheck(model, base_dir)
        self.transform(model, base_dir)
        return model.SerializeToString()

    def _write_input(self, model_bytes: bytes) -> bytes:
        return self.prepare(model_bytes, None) if self.prepares_writes else model_bytes

    def _saved(self, data: bytes) -> bytes:
        if type(self).on_save is Fault.on_save:
            return data
        model = schema.parse_model(data)
        self.on_save(model)
        return model.SerializeToString()

    # ------------------------------------------------------------------------- adapter calls
    def verify(self, model_bytes, base_dir):
        with self.injected():
            return super().verify(self.prepare(model_bytes, base_dir), base_dir)

    def decode(self, model_bytes, value_name, base_dir):
        with self.injected():
            return super().decode(self.prepare(model_bytes, base_dir), value_name, base_dir)

    def read_fields(self, model_bytes, value_name, base_dir):
        with self.injected():
            return super().read_fields(self.prepare(model_bytes, base_dir), value_name, base_dir)

    def roundtrip(self, model_bytes, base_dir=None):
        with self.injected():
            return self._saved(super().roundtrip(self._write_input(model_bytes), base_dir))

    def open_state(self, model_bytes, initial, base_dir=None):
        with self.injected():
            handle = super().open_state(self.prepare(model_bytes, base_dir), initial, base_dir)
        self.opened = handle
        try:
            return self.make_state(handle)
        finally:
            self.opened = None

    def export(self, model_bytes, target, base_dir=None):
        with self.injected():
            exported = super().export(self._write_input(model_bytes), target, base_dir)
        return self._saved(exported) if target == "onnx-light" else exported

    def rewrite(self, model_bytes, rewrite, base_dir=None):
        with self.injected():
            return super().rewrite(self._write_input(model_bytes), rewrite, base_dir)


#: the name a data-defined fault class carries until ``name_faults`` gives it the one it is bound to
_UNNAMED = "UnnamedFault"


def fault(fault_id: str, clauses: tuple[str, ...], doc: str, *, patches: Callable[[], list[Patch]] | None = None,
          transform: Callable[[Any, str | None], None] | None = None,
          precheck: Callable[[Any, str | None], None] | None = None, on_save: Callable[[Any], None] | None = None,
          state: type[ReferenceState] | None = None, **flags: Any) -> type[Fault]:
    """A fault written as data: its ID, clauses, what the runtime author got wrong, and its seams.

    Most bugs are one of a few shapes (a check skipped, a value read from the wrong place, a copy
    added, a constant changed), each a patch list or a model edit, so a fault is one call rather than a
    class. ``state`` is the ``FaultState`` subclass the runtime's state handles are. Only the seams
    given are overridden, so the audit scopes the fault exactly as it would a hand-written class. ``flags``
    become class members as they are: the flags (``boundary``, ``pending``, ...) or an adapter method the
    bug lives in (``open_state``, ``executor_kernels``). The class is named after the module attribute it
    is bound to by ``name_faults``."""
    namespace: dict[str, Any] = {"fault_id": fault_id, "clauses": tuple(clauses), "__doc__": doc,
                                 "__module__": sys._getframe(1).f_globals["__name__"], **flags}
    if patches is not None:
        namespace["patches"] = lambda self: patches()
    if transform is not None:
        namespace["transform"] = lambda self, model, base_dir: transform(model, base_dir)
    if precheck is not None:
        namespace["precheck"] = lambda self, model, base_dir: precheck(model, base_dir)
    if on_save is not None:
        namespace["on_save"] = lambda self, model: on_save(model)
    if state is not None:
        namespace["make_state"] = lambda self, handle: state(handle.state, self)
    return type(_UNNAMED, (Fault,), namespace)


def name_faults(namespace: dict[str, Any]) -> None:
    """Name each data-defined fault of a module after the attribute it is bound to, so that its
    ``module:Class`` spec (what ``--adapter`` accepts) finds it."""
    for attribute, value in namespace.items():
        if isinstance(value, type) and issubclass(value, Fault) and value.__name__ == _UNNAMED:
            value.__name__ = value.__qualname__ = attribute


def _injected(name: str) -> Callable:
    """The reference state's method ``name``, run with the handle's fault's patches installed."""
    method = getattr(ReferenceState, name)

    def injected(self, *args, **kwargs):
        with self.fault.injected():
            return method(self, *args, **kwargs)
    return injected


class FaultState(ReferenceState):
    """A reference state whose calls run with its fault's patches installed."""

    def __init__(self, state, fault: Fault, like: ReferenceState | None = None) -> None:
        # the reference handle this one wraps (its Hold slot and KV counters): the one being opened, or
        # ``like`` for a handle a fault wraps again after ``open_state`` returned it
        opened = like if like is not None else fault.opened
        super().__init__(state, opened.slot if opened is not None else None)
        if opened is not None:
            self._kv = opened._kv
        self.fault = fault

    run, run_cancelled, run_held, values, reset, close = (
        _injected(name) for name in ("run", "run_cancelled", "run_held", "values", "reset", "close"))


def hooked_state(init: Callable | None = None, **hooks: Callable) -> type[FaultState]:
    """A ``FaultState`` whose methods named in ``hooks`` run as ``hook(handle, call, *args)``, ``call`` being the
    plain method (patches installed): most state bugs change what a call is given or returns, or act around it.
    Each handle takes the ``note`` its fault left for it (what ``open_state`` saw), then ``init(handle)`` runs."""
    def hooked(name, hook):
        method = getattr(FaultState, name)
        return lambda self, *args, **kwargs: hook(self, functools.partial(method, self), *args, **kwargs)

    def __init__(self, state, fault, like=None):
        FaultState.__init__(self, state, fault, like)
        self.note = getattr(fault, "note", None)
        if init is not None:
            init(self)
    return type("HookedState", (FaultState,), {"__init__": __init__,
                                               **{name: hooked(name, hook) for name, hook in hooks.items()}})


# ------------------------------------------------------------------------------- model walking
def struct_types(model) -> Iterator[tuple[Any, str]]:
    """Every StructTypeProto of a model with its role: ``declaration`` (the catalogue), ``type`` (inside
    a TypeProto) or ``layout`` (an encoded value's layout)."""
    for decl in model.struct_types:
        yield decl, "declaration"
        yield from _nested_in_struct(decl)
    for graph in graphs(model):
        for group in (graph.input, graph.output, graph.value_info):
            for info in group:
                if info.HasField("type"):
                    yield from _in_type(info.type)
        for value in graph.encoded_initializer:
            if value.WhichOneof("layout") == "struct_type":
                yield value.struct_type, "layout"
                yield from _nested_in_struct(value.struct_type)
            if value.HasField("logical_type"):
                yield from _in_type(value.logical_type)


def _in_type(tp) -> Iterator[tuple[Any, str]]:
    which = tp.WhichOneof("value")
    if which == "struct_type":
        yield tp.struct_type, "type"
        yield from _nested_in_struct(tp.struct_type)
    elif which == "sequence_type":
        yield from _in_type(tp.sequence_type.elem_type)
    elif which == "map_type":
        yield from _in_type(tp.map_type.value_type)
    elif which == "optional_type":
        yield from _in_type(tp.optional_type.elem_type)


def _nested_in_struct(st) -> Iterator[tuple[Any, str]]:
    kind = st.WhichOneof("kind")
    if kind == "array":
        yield from _in_type(st.array.element_type)
    elif kind == "structure":
        for field in st.structure.field:
            if field.WhichOneof("content") == "type":
                yield from _in_type(field.type)


def graphs(model) -> Iterator[Any]:
    """The root graph and every subgraph (node attributes, function bodies), outermost first."""
    pending = [model.graph]
    pending += [graph for function in model.functions for node in function.node for graph in _subgraphs(node)]
    while pending:
        graph = pending.pop(0)
        yield graph
        for node in graph.node:
            pending.extend(_subgraphs(node))


def _subgraphs(node) -> list:
    found = []
    for attribute in node.attribute:
        if attribute.HasField("g"):
            found.append(attribute.g)
        found.extend(attribute.graphs)
    return found


def type_refs(st) -> list[int]:
    """The IDs a StructTypeProto refers to directly (in its fields and element types, not through them)."""
    return [nested.type_ref for nested, _ in _nested_in_struct(st) if nested.WhichOneof("kind") == "type_ref"]


def encoded_values(model) -> Iterator[Any]:
    for graph in graphs(model):
        yield from graph.encoded_initializer


__all__ = ["INSTALLER", "TESTEE_COPIES_RETURNED_VALUES", "Fault", "FaultState", "Patch", "decode_module",
           "enclosing_depth", "encoded_values", "fault", "graphs", "hooked_state", "name_faults", "returning",
           "skip", "struct_types", "type_refs", "wrap"]
