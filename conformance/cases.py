"""The case catalogue: TOML manifests under ``corpus/cases`` that name models in protobuf text format
(or named builders for large payloads) and the outcome each case expects.

A manifest holds ``[[case]]`` tables and ``[[family]]`` tables (a case template expanded over a small
parameter matrix, ``$name`` placeholders). Text models may come from a ``.txtpb`` file (``model``),
inline text (``model_text``), a named template (``template`` + ``vars``) or a builder (``builder`` +
``args``); ``merge`` text is merged onto the model afterwards. See docs/conformance.md. Templating lives in
``conformance/templates.py``, family expansion in ``conformance/families.py``; this module loads and
validates cases and materializes their models.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
import pathlib
import re
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from conformance import case_files, locations
from conformance.adapters import PROFILES, SuiteError
from conformance.families import expand_family
from conformance.templates import expand_template, substitute

LEVELS = ("Required", "Recommended")
OPERATIONS = ("verify", "decode", "fields", "roundtrip", "state", "export", "rewrite")
EXPECTATION_SOURCES = ("spec", "hand", "onnx-reference", "numpy", "onnxruntime", "oracle", "wire")
_ID = re.compile(r"^(Required|Recommended)(\.[A-Za-z0-9_\-]+){3,}$")


def default_corpus() -> pathlib.Path:
    """``$CONFORMANCE_CORPUS``, or the suite's own corpus (installed or in a checkout: ``conformance.locations``)."""
    env = os.environ.get("CONFORMANCE_CORPUS")
    if env:
        return pathlib.Path(env)
    return locations.corpus_dir()


@dataclass
class Case:
    """One conformance case, as written in its manifest (plus where it came from)."""

    id: str
    clauses: list[str]
    op: str
    profile: str
    expect: dict
    source: str
    description: str = ""
    #: the spec sentence(s) that force the expectation, verbatim (every Required case has one)
    quote: list[str] = field(default_factory=list)
    expectation_source: str = "hand"
    model_text: str | None = None
    builder: str | None = None
    args: dict = field(default_factory=dict)
    merge: str | None = None
    value: str | None = None
    files: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)
    #: further models a state trace opens by name (``open`` with ``model = "name"``): their texts
    models: dict = field(default_factory=dict)
    target: str | None = None
    rewrite: dict | None = None
    raw: dict = field(default_factory=dict)
    corpus: pathlib.Path | None = None
    _built: Any = None

    @property
    def level(self) -> str:
        return self.id.split(".", 1)[0]

    @property
    def area(self) -> str:
        return self.id.split(".")[1]

    # ------------------------------------------------------------------------------- materialize
    def build(self):
        """(model bytes, external files {relative path: bytes}, builder extras), built once."""
        if self._built is None:
            self._built = _materialize(self)
        return self._built

    def model_bytes(self) -> bytes:
        return self.build()[0]

    def external_files(self) -> dict[str, bytes]:
        return self.build()[1]

    def extras(self) -> dict:
        return self.build()[2]

    def other_model_bytes(self, name: str) -> bytes:
        """One of the case's further models (``models``, or a builder's ``models``), by name."""
        found = self.extras().get("models", {})
        if name not in found:
            raise SuiteError(f"{self.id}: no model named {name!r} (the case has {sorted(found) or 'none'})")
        return found[name]

    def write_files(self, directory: str | os.PathLike) -> None:
        """Write the external files into ``directory``, only inside it (conformance/case_files.py)."""
        case_files.write(directory, self.external_files(), f"case {self.id}")

    def sha256(self) -> str:
        """Digest of everything that defines the case: its manifest entry, model and files."""
        digest = hashlib.sha256()
        digest.update(json.dumps(self.raw, sort_keys=True, separators=(",", ":"), default=str).encode())
        digest.update(self.model_bytes())
        for relative, data in sorted(self.external_files().items()):
            digest.update(relative.encode() + b"\0" + hashlib.sha256(data).digest())
        for name, data in sorted(self.extras().get("models", {}).items()):
            digest.update(b"model:" + name.encode() + b"\0" + hashlib.sha256(data).digest())
        return digest.hexdigest()

    def state_steps(self) -> list:
        """A state case's trace: written in the manifest, or made by its builder."""
        return list(self.steps or self.extras().get("steps", [])) if self.op == "state" else []

    def summary(self) -> str:
        """What the case expects, in one line."""
        expect = self.expect
        if self.op == "state":
            return f"state trace of {len(self.state_steps())} steps"
        if "error" in expect:
            return f"rejected with {expect['error']}"
        if "values_digest" in expect:
            digest = expect["values_digest"]
            return (f"decodes {self.value!r} to {digest['dtype']}{list(digest['shape'])} values with SHA-256 "
                    f"{digest['sha256']}")
        if "fields_digest" in expect:
            return f"reads fields {sorted(expect['fields_digest'])} of {self.value!r} with their expected SHA-256"
        if "values" in expect or expect.get("values_from_builder"):
            tol = f" (atol {expect.get('atol', 0)}, rtol {expect.get('rtol', 0)})"
            return f"decodes {self.value!r} to the expected values{tol}"
        return "accepted"


# --------------------------------------------------------------------------------------- loading
@functools.lru_cache(maxsize=4)
def load_cases(corpus: str | None = None) -> tuple[Case, ...]:
    """Every case of the corpus, validated for unique IDs, known clauses, profiles and operations."""
    root = pathlib.Path(corpus) if corpus else default_corpus()
    case_dir = root / "cases"
    if not case_dir.is_dir():
        raise SuiteError(f"no case directory at {case_dir}")
    shared = _load_toml(case_dir / "_templates.toml") if (case_dir / "_templates.toml").exists() else {}
    shared_templates = shared.get("templates", {})
    cases: list[Case] = []
    # Promoted fuzz findings (corpus/regressions/cases) are cases like any other.
    regression_dir = root / "regressions" / "cases"
    manifests = sorted(case_dir.rglob("*.toml"))
    if regression_dir.is_dir():
        manifests += sorted(regression_dir.rglob("*.toml"))
    for manifest in manifests:
        if manifest.name.startswith("_"):
            continue
        data = _load_toml(manifest)
        templates = {**shared_templates, **data.get("templates", {})}
        defaults = {k: data[k] for k in ("profile", "op", "expectation_source", "value", "quote") if k in data}
        relative = manifest.relative_to(root).as_posix()
        for entry in data.get("case", []):
            cases.append(_make_case({**defaults, **entry}, templates, manifest.parent, relative, root))
        for family in data.get("family", []):
            for entry in expand_family(family):
                cases.append(_make_case({**defaults, **entry}, templates, manifest.parent, relative, root))
    _check_unique(cases)
    return tuple(sorted(cases, key=lambda c: c.id))


def _load_toml(path: pathlib.Path) -> dict:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise SuiteError(f"{path}: {error}") from None


def _make_case(entry: dict, templates: dict, directory: pathlib.Path, source: str, root: pathlib.Path) -> Case:
    case_id = entry.get("id", "")
    where = f"{source}: case {case_id or '<no id>'}"
    if not _ID.match(case_id):
        raise SuiteError(f"{where}: IDs are Level.Area.Topic.Case with Level in {LEVELS}")
    op = entry.get("op")
    if op not in OPERATIONS:
        raise SuiteError(f"{where}: op {op!r} is not one of {OPERATIONS}")
    profile = entry.get("profile")
    if profile not in PROFILES:
        raise SuiteError(f"{where}: profile {profile!r} is not one of {sorted(PROFILES)}")
    clauses = entry.get("clause") or []
    if isinstance(clauses, str):
        clauses = [clauses]
    from reference_impl.clauses import CLAUSES

    unknown = [c for c in clauses if c not in CLAUSES]
    if not clauses or unknown:
        raise SuiteError(f"{where}: clauses {unknown or '(none)'} are not spec clause IDs")
    quote = entry.get("quote") or []
    if isinstance(quote, str):
        quote = [quote]
    source_kind = entry.get("expectation_source", "hand")
    if source_kind not in EXPECTATION_SOURCES:
        raise SuiteError(f"{where}: expectation_source {source_kind!r} not in {EXPECTATION_SOURCES}")
    text = None
    variables = entry.get("vars", {})
    if "model" in entry:
        problem = case_files.key_problem(entry["model"])
        if problem:
            raise SuiteError(f"{where}: model path {problem}")
        try:
            text = substitute((directory / entry["model"]).read_text(), variables)
        except (OSError, UnicodeDecodeError) as error:
            raise SuiteError(f"{where}: model {entry['model']!r} cannot be read ({error})") from None
    elif "model_text" in entry:
        text = expand_template(entry["model_text"], variables, templates, where)
    elif "template" in entry:
        template = templates.get(entry["template"])
        if template is None:
            raise SuiteError(f"{where}: unknown template {entry['template']!r}")
        if isinstance(template, dict):
            variables = {**template.get("vars", {}), **variables}
            template = template["text"]
        text = expand_template(template, variables, templates, where)
    elif "builder" not in entry:
        raise SuiteError(f"{where}: a case needs model, model_text, template or builder")
    models = entry.get("models", {})
    if not isinstance(models, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in models.items()):
        raise SuiteError(f"{where}: models is a table of model texts by name")
    models = {name: expand_template(body, variables, templates, where) for name, body in models.items()}
    merge = entry.get("merge")
    if merge is not None:
        merge = expand_template(merge, variables, templates, where)
    expect = dict(entry.get("expect", {}))
    if expect.get("error") == "":  # a family row with an empty code expects acceptance
        expect = {k: v for k, v in expect.items() if k != "error"} or {"accepted": True}
    if op in ("verify", "decode", "fields", "roundtrip", "export", "rewrite") and not expect:
        raise SuiteError(f"{where}: the case states no expectation")
    raw = {k: v for k, v in entry.items() if k not in ("model", "template")}
    raw["model_text"] = text
    raw["merge"] = merge
    return Case(id=case_id, clauses=list(clauses), op=op, profile=profile, expect=expect, source=source,
                description=entry.get("description", ""), quote=list(quote), expectation_source=source_kind,
                model_text=text,
                builder=entry.get("builder"), args=entry.get("args", {}), merge=merge,
                value=entry.get("value"), files=case_files.check(entry.get("files", {}), where),
                steps=entry.get("step", []), models=models,
                target=entry.get("target"), rewrite=entry.get("rewrite"), raw=raw, corpus=root)


def _check_unique(cases: list[Case]) -> None:
    seen: dict[str, str] = {}
    for case in cases:
        if case.id in seen:
            raise SuiteError(f"case {case.id} is defined in {seen[case.id]} and {case.source}")
        seen[case.id] = case.source


# ---------------------------------------------------------------------------------- materializing
def _materialize(case: Case):
    from google.protobuf import text_format

    from reference_impl import schema

    extras: dict = {}
    files: dict[str, bytes] = {}
    if case.builder:
        built = builders(case.corpus)[case.builder](**case.args)
        model = built.get("model")
        files.update(built.get("files", {}))
        extras = {k: v for k, v in built.items() if k not in ("model", "files")}
        if isinstance(model, (bytes, bytearray)):
            model = schema.parse_model(bytes(model)) if case.merge else bytes(model)
    else:
        try:
            model = schema.parse_text(case.model_text, "ModelProto")
        except text_format.ParseError as error:
            raise SuiteError(f"{case.id}: model text does not parse: {error}") from None
    if case.merge:
        try:
            text_format.Merge(case.merge, model)
        except text_format.ParseError as error:
            raise SuiteError(f"{case.id}: merge text does not parse: {error}") from None
    for relative, spec in case.files.items():
        files[relative] = file_bytes(spec, case.id)
    case_files.check(files, f"case {case.id}")  # a builder's keys too
    extras["models"] = {**dict(extras.get("models", {})), **_other_models(case)}
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return data, files, extras


def _other_models(case: Case) -> dict[str, bytes]:
    """The case's further models (``models`` texts) as bytes."""
    from google.protobuf import text_format

    from reference_impl import schema

    found = {}
    for name, text in case.models.items():
        try:
            found[name] = schema.parse_text(text, "ModelProto").SerializeToString()
        except text_format.ParseError as error:
            raise SuiteError(f"{case.id}: model {name!r} does not parse: {error}") from None
    return found


#: The largest file a ``{size = n, fill = b}`` spec may ask for (a corpus may come from anyone).
MAX_FILL_BYTES = 1 << 30


def file_bytes(spec: Any, case_id: str = "") -> bytes:
    """Bytes of an external payload file: ``{hex = "..."}``, ``{size = n, fill = b}`` or concatenations
    ``{parts = [...]}``."""
    if isinstance(spec, dict):
        if "hex" in spec:
            return bytes.fromhex(spec["hex"].replace(" ", ""))
        if "size" in spec:
            size, fill = spec["size"], spec.get("fill", 0)
            if not (isinstance(size, int) and 0 <= size <= MAX_FILL_BYTES and isinstance(fill, int)
                    and 0 <= fill <= 255):
                raise SuiteError(f"{case_id}: a filled file needs 0 <= size <= {MAX_FILL_BYTES} and a byte fill")
            return bytes([fill]) * size
        if "parts" in spec:
            return b"".join(file_bytes(part, case_id) for part in spec["parts"])
    raise SuiteError(f"{case_id}: cannot read file spec {spec!r}")


@functools.lru_cache(maxsize=4)
def _load_builders(corpus: str) -> dict:
    """The builders of a corpus's ``builders`` package (none when it has no such package)."""
    package = builders_package(pathlib.Path(corpus))
    return dict(package.BUILDERS) if package else {}


def builders_package(corpus: pathlib.Path | None = None) -> ModuleType | None:
    """The ``builders`` package of a corpus (default: the suite's own), or None when it has none. The
    suite's own is imported by its package name where that name reaches the same files
    (``locations.builders_package``); any other is imported from its path (its modules import each other
    relatively, so a copied corpus brings its own builders)."""
    path = pathlib.Path(corpus or default_corpus()).resolve() / "builders" / "__init__.py"
    if not path.exists():
        return None
    own = locations.builders_package()
    if own and path.parent == (locations.corpus_dir() / "builders").resolve():
        return importlib.import_module(own)
    name = f"corpus_builders_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=[str(path.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a package must be importable by its name for its relative imports
    spec.loader.exec_module(module)
    return module


def builders(corpus: pathlib.Path | None = None) -> dict:
    """Named builders (``corpus/builders``): functions returning {model, files?, expected?, ...}."""
    return _load_builders(str(corpus or default_corpus()))


def select(cases, patterns: list[str] | None = None, level: str | None = None, profiles: set[str] | None = None,
           shard: tuple[int, int] | None = None) -> list[Case]:
    """Filter by glob-ish patterns (``*`` wildcards, prefix match), level, profiles, then shard i/n. A
    pattern naming cases only by their IDs before a rename selects their current IDs (``renames``)."""
    from conformance import renames

    cases = list(cases)
    if patterns:
        patterns = upgrade_patterns(patterns, cases)
    chosen = []
    for case in cases:
        if level and case.level != level:
            continue
        if profiles and case.profile not in profiles:
            continue
        if patterns and not any(renames.pattern_matches(p, case.id) for p in patterns):
            continue
        chosen.append(case)
    if shard:
        index, count = shard
        chosen = [case for n, case in enumerate(chosen) if n % count == index - 1]
    return chosen


def upgrade_patterns(patterns: list[str], cases) -> list[str]:
    """``patterns`` with each one that names cases only by old IDs replaced by their current IDs."""
    from conformance import renames

    table = renames.table_of(cases)
    if not table:
        return list(patterns)
    ids = [case.id for case in cases]
    upgraded: list[str] = []
    for pattern in patterns:
        upgraded += renames.renamed_targets(pattern, table, ids) or [pattern]
    return upgraded


def rename_notes(patterns: list[str] | None, cases) -> list[str]:
    """One note per ``--cases`` pattern that names cases by their IDs before a rename."""
    from conformance import renames

    table = renames.table_of(cases)
    ids = [case.id for case in cases]
    notes = []
    for pattern in patterns or []:
        targets = renames.renamed_targets(pattern, table, ids) if table else []
        if targets:
            notes.append(renames.note("--cases", pattern, targets))
    return notes
