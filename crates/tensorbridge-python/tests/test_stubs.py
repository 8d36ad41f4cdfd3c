"""The type stubs (``python/tensorbridge/_native.pyi``) against the compiled module: the same
names, the same signatures (parameter names, kinds and defaults, read from each function's
``__text_signature__``), the same ``View`` properties, and ``dtype``/``device`` typed rather
than ``Any``, with every kind of value the ``DType`` and ``Device`` aliases name accepted at
run time. A parameter renamed, added or given another default on one side only fails here.
"""

import ast
import ctypes
import inspect
import os

import numpy as np
import pytest

import tensorbridge
from tensorbridge import _native

HERE = os.path.dirname(os.path.abspath(__file__))


def _stub_path():
    # The source tree's stub when the suite runs from it, else the installed wheel's (the GPU
    # bundle carries the tests without the sources).
    src = os.path.join(os.path.dirname(HERE), "python", "tensorbridge", "_native.pyi")
    if os.path.exists(src):
        return src
    return os.path.join(os.path.dirname(tensorbridge.__file__), "_native.pyi")


@pytest.fixture(scope="module")
def stub():
    with open(_stub_path()) as f:
        return ast.parse(f.read())


def _functions(body):
    return {n.name: n for n in body if isinstance(n, ast.FunctionDef)}


def _is_property(fn):
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def _view_class(stub):
    (cls,) = [n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "View"]
    return cls


def _stub_params(fn, skip_self=False):
    """[(name, kind, default)] of a stub function, in inspect's terms."""
    a = fn.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [
        ast.literal_eval(d) for d in a.defaults
    ]
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        if skip_self and i == 0:
            continue
        kind = (
            inspect.Parameter.POSITIONAL_ONLY
            if arg in a.posonlyargs
            else inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        out.append((arg.arg, kind, default))
    if a.vararg:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.empty))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        default = inspect.Parameter.empty if d is None else ast.literal_eval(d)
        out.append((arg.arg, inspect.Parameter.KEYWORD_ONLY, default))
    if a.kwarg:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, inspect.Parameter.empty))
    return out


def _runtime_params(obj, skip_self=False):
    params = list(inspect.signature(obj).parameters.values())
    if skip_self and params and params[0].name in ("self", "$self"):
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


def test_module_names_match(stub):
    runtime = {n for n in dir(_native) if not n.startswith("_")}
    declared = set(_functions(stub.body)) | {
        n.name for n in stub.body if isinstance(n, ast.ClassDef)
    }
    assert runtime == declared
    (stub_all,) = [
        ast.literal_eval(n.value)
        for n in stub.body
        if isinstance(n, ast.Assign) and [t.id for t in n.targets] == ["__all__"]
    ]
    assert stub_all == _native.__all__
    assert set(tensorbridge.__all__) == declared | {"__version__"}


@pytest.mark.parametrize("name", ["asview", "from_ptr", "share", "open"])
def test_function_signatures_match(stub, name):
    fn = _functions(stub.body)[name]
    assert _stub_params(fn) == _runtime_params(getattr(_native, name))


def test_view_properties_match(stub):
    cls = _view_class(stub)
    declared = {n for n, f in _functions(cls.body).items() if _is_property(f)}
    runtime = {
        n for n, v in vars(_native.View).items() if inspect.isgetsetdescriptor(v)
    }
    assert declared == runtime


def test_view_methods_match(stub):
    cls = _view_class(stub)
    methods = {n: f for n, f in _functions(cls.body).items() if not _is_property(f)}
    runtime_public = {
        n for n in dir(_native.View) if not n.startswith("_")
    }
    declared_public = {n for n in _functions(cls.body) if not n.startswith("_")}
    assert runtime_public == declared_public
    for name, fn in methods.items():
        assert _stub_params(fn, skip_self=True) == _runtime_params(
            getattr(_native.View, name), skip_self=True
        ), name


def _class(stub, name):
    (cls,) = [n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == name]
    return cls


def test_handle_matches(stub):
    cls = _class(stub, "Handle")
    fns = _functions(cls.body)
    declared = {n for n, f in fns.items() if _is_property(f)}
    runtime = {n for n, v in vars(_native.Handle).items() if inspect.isgetsetdescriptor(v)}
    assert declared == runtime
    assert {n for n in dir(_native.Handle) if not n.startswith("_")} == {
        n for n in fns if not n.startswith("_")
    }
    assert _stub_params(fns["__init__"], skip_self=True) == _runtime_params(
        _native.Handle, skip_self=True
    )


def _annotation(fn, param):
    a = fn.args
    for arg in a.posonlyargs + a.args + a.kwonlyargs:
        if arg.arg == param:
            return ast.unparse(arg.annotation)
    raise KeyError(param)


def test_dtype_and_device_are_typed(stub):
    fn = _functions(stub.body)["from_ptr"]
    assert _annotation(fn, "dtype") == "_DType"
    assert _annotation(fn, "device") == "Optional[_Device]"
    aliases = {
        t.id: ast.unparse(n.value)
        for n in stub.body
        if isinstance(n, ast.Assign)
        for t in n.targets
    }
    for alias in ("_DType", "_Device"):
        assert "Any]" not in aliases[alias].replace("dtype[Any]", ""), aliases[alias]
        assert aliases[alias] != "Any"


def test_every_kind_the_aliases_name_is_accepted():
    """_DType: str, numpy.dtype, NumPy scalar type, torch.dtype, bool/int/float/complex.
    _Device: str, (device_type, device_id), torch.device."""
    buf = (ctypes.c_double * 4)()
    addr = ctypes.addressof(buf)
    dtypes = ["float64", np.dtype("float64"), np.float64, float]
    devices = ["cpu", (1, 0)]
    try:
        import torch

        dtypes.append(torch.float64)
        devices.append(torch.device("cpu"))
    except ImportError:
        pass
    for dt in dtypes:
        v = tensorbridge.from_ptr(addr, (4,), dt, device="cpu", owner=buf)
        assert v.dtype_name == "float64", dt
    for dev in devices:
        v = tensorbridge.from_ptr(addr, (4,), "float64", device=dev, owner=buf)
        assert v.device == "cpu", dev
    for ty, name in ((bool, "bool"), (int, "int64"), (complex, "complex128")):
        assert tensorbridge.from_ptr(addr, (1,), ty, device="cpu", owner=buf).dtype_name == name


def test_mypy_stubtest_finds_nothing(tmp_path):
    """mypy's own stub checker on the installed module, where mypy is installed (it is not in
    python/requirements.txt: it analyses NumPy's and torch's stubs too, over a minute cold)."""
    pytest.importorskip("mypy.stubtest")
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "tensorbridge._native"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
