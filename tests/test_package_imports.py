"""The packages import their public names on first use: every name still resolves to its submodule's
object, and a light entry point (the command lines' shared manners) imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import reference_impl
import size_gate

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", [reference_impl, size_gate], ids=lambda p: p.__name__)
def test_every_public_name_is_its_submodules_object(package):
    for name in package.__all__:
        value = getattr(package, name)
        if name in getattr(package, "_SUBMODULES", ()):
            assert value is sys.modules[f"{package.__name__}.{name}"]
            continue
        module = sys.modules[f"{package.__name__}.{package._EXPORTS[name]}"]
        assert value is getattr(module, name), name
        assert name in dir(package)
    with pytest.raises(AttributeError):
        package.no_such_name  # noqa: B018 - the lookup is the test


def test_a_function_named_like_its_submodule_stays_the_function():
    """Importing ``reference_impl.decode`` binds the name on the package to the module; the public
    ``reference_impl.decode`` (and ``size_gate.compare``) must stay the function."""
    import reference_impl.decode as decode_module_binding  # noqa: F401 - the import is the test
    import size_gate.compare  # noqa: F401
    from reference_impl import decode
    from size_gate import compare

    assert callable(decode) and decode.__module__ == "reference_impl.decode"
    assert reference_impl.decode is sys.modules["reference_impl.decode"].decode
    assert callable(compare) and size_gate.compare is sys.modules["size_gate.compare"].compare
    assert reference_impl.schema is sys.modules["reference_impl.schema"]  # submodules resolve too


def test_a_patched_function_is_what_the_package_name_gives():
    """Nothing is cached on the package, so patching a submodule's function (as the audit's faults do)
    is seen through the package name, and undone with it."""
    module = sys.modules["reference_impl.verifier"]
    original = module.verify_model
    module.verify_model = patched = lambda *args, **kwargs: None
    try:
        assert reference_impl.verify_model is patched
    finally:
        module.verify_model = original
    assert reference_impl.verify_model is original


def test_the_shared_command_line_manners_import_nothing_heavy():
    probe = ("import sys\nimport reference_impl.broken_pipe\n"
             "print([m for m in ('numpy', 'onnx', 'google.protobuf', 'reference_impl.errors') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
