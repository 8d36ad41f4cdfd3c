"""An address nothing can verify is never trusted from an arbitrary class
(design: "Only the CAPSULE form of the exchange table (``__dlpack_c_exchange_api__``) is
trusted; a bare int (``__c_dlpack_exchange_api__``) from an arbitrary class is never
dereferenced"; [refuse]).

``__c_dlpack_exchange_api__ = 16`` on any class made ``tb.asview`` read a table at address
16 (a segfault). Here the int form is set to: small ints, ``True``, the address of a
``PROT_NONE`` page (any read faults), and the address of a well-formed DLPack 1.3 table whose
functions are counting callbacks (any call is seen). None may crash, none may be called;
the import refuses with a typed exception, or (when the class also has a ``__dlpack__``)
may use that. Other values of either attribute, and a real ``dlpack_exchange_api`` capsule
(PyTorch's, tensorbridge's) on a class that is not its producer, give a typed exception or
a view through the class's own ``__dlpack__``, never a crash. Each case runs in a child
interpreter (the old behaviour crashes).
"""

import pytest

from adversary import run_case

INT_VALUES = ["16", "1", "True", "-16", "2**64 - 8", "guard_page", "counting_table"]
OTHER_VALUES = ["'0x10'", "None", "1.5", "b'x'", "[16]", "object()", "2**64 + 5"]
CAPSULES = ["torch", "tensorbridge", "counting_table_capsule"]


def _counting_table():
    """A DLPack 1.3 exchange table (ctypes) whose five functions count their calls and fail;
    returns (address, calls, keep-alive)."""
    import ctypes

    from tbhelpers import (
        ALLOCATOR,
        CURRENT_WORK_STREAM,
        DLTENSOR_FROM_PY,
        FROM_PY,
        TO_PY,
        DLPackExchangeAPI,
    )

    calls = []

    def counter(name):
        def f(*_args):
            calls.append(name)
            return -1

        return f

    fns = {
        "managed_tensor_allocator": ALLOCATOR(counter("allocator")),
        "managed_tensor_from_py_object_no_sync": FROM_PY(counter("from_py")),
        "managed_tensor_to_py_object_no_sync": TO_PY(counter("to_py")),
        "dltensor_from_py_object_no_sync": DLTENSOR_FROM_PY(counter("dltensor_from_py")),
        "current_work_stream": CURRENT_WORK_STREAM(counter("current_work_stream")),
    }
    table = DLPackExchangeAPI()
    table.version.major, table.version.minor = 1, 3
    table.prev_api = None
    for field, fn in fns.items():
        setattr(table, field, ctypes.cast(fn, ctypes.c_void_p).value)
    return ctypes.addressof(table), calls, (table, fns)


def _value(spec, keep):
    from adversary import PAGE, Guarded

    if spec == "guard_page":
        g = Guarded(16, "start")
        keep.append(g)
        return g.lo - PAGE  # the PROT_NONE page right before the bytes
    if spec == "counting_table":
        address, calls, k = _counting_table()
        keep.append(k)
        keep.append(calls)
        return address
    return eval(spec)  # noqa: S307 - the specs are this file's literals


def _import(cls, with_dlpack):
    """tb.asview of an instance; with ``with_dlpack`` the class also has a NumPy-backed
    ``__dlpack__``, which a refusal of the table may fall back to."""
    import numpy as np

    import tensorbridge as tb
    from adversary import TYPED_ERRORS

    a = np.arange(4, dtype=np.float32)
    if with_dlpack:
        cls.__dlpack__ = lambda self, **kw: a.__dlpack__(**kw)
        cls.__dlpack_device__ = lambda self: (1, 0)
    try:
        v = tb.asview(cls())
    except TYPED_ERRORS as e:
        print(f"refused: {type(e).__name__}: {e}", flush=True)
        return
    print(f"accepted: {v!r}", flush=True)
    assert with_dlpack, f"an object with nothing but an exchange attribute was viewed: {v!r}"
    assert v.ptr == a.ctypes.data and v.shape == (4,), "the view is not the class's __dlpack__ export"


def case_int_attribute(spec, attribute, with_dlpack):
    keep = []
    value = _value(spec, keep)
    cls = type("Arbitrary", (), {attribute: value})
    _import(cls, with_dlpack)
    calls = next((k for k in keep if isinstance(k, list)), [])
    assert calls == [], f"tensorbridge called functions of a table it was given as an int: {calls}"


@pytest.mark.parametrize("with_dlpack", [False, True], ids=["bare", "with_dlpack"])
@pytest.mark.parametrize("spec", INT_VALUES)
def test_int_exchange_attribute_is_never_dereferenced(spec, with_dlpack):
    """``__c_dlpack_exchange_api__`` as an int on an arbitrary class: no crash, no
    call into what it points at."""
    run_case(__file__, "case_int_attribute", spec, "__c_dlpack_exchange_api__", with_dlpack)


def case_other_values(attribute, specs):
    """Every spec, bare and with ``__dlpack__``, in one interpreter (none crashes today):
    the last line printed names the case a crash happened in."""
    for spec in specs:
        for with_dlpack in (False, True):
            print(f"case: {attribute} = {spec}, with_dlpack={with_dlpack}", flush=True)
            case_int_attribute(spec, attribute, with_dlpack)


OTHER_CASES = {
    "__c_dlpack_exchange_api__": OTHER_VALUES,
    "__dlpack_c_exchange_api__": OTHER_VALUES + ["16", "True", "counting_table"],
}


@pytest.mark.parametrize("attribute", list(OTHER_CASES))
def test_other_exchange_attribute_values_are_refused_cleanly(attribute):
    """Values of the wrong type in either attribute (an int in the capsule's place
    too): a typed exception or the class's own ``__dlpack__``, never a crash, and nothing
    the attribute points at is called."""
    run_case(__file__, "case_other_values", attribute, OTHER_CASES[attribute])


def case_foreign_capsule(which, with_dlpack):
    keep = []
    if which == "torch":
        import torch

        capsule = torch.Tensor.__dlpack_c_exchange_api__
    elif which == "tensorbridge":
        import tensorbridge as tb

        capsule = tb.View.__dlpack_c_exchange_api__
    else:
        import ctypes

        from tbhelpers import _api

        new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
            ("PyCapsule_New", _api)
        )
        address, calls, k = _counting_table()
        keep += [k, calls]
        capsule = new(address, b"dlpack_exchange_api", None)
    cls = type("NotTheProducer", (), {"__dlpack_c_exchange_api__": capsule})
    _import(cls, with_dlpack)
    print(f"calls into the table: {keep[1] if keep else 'n/a'}", flush=True)


@pytest.mark.parametrize("with_dlpack", [False, True], ids=["bare", "with_dlpack"])
@pytest.mark.parametrize("which", CAPSULES)
def test_exchange_capsule_on_a_class_that_is_not_its_producer(which, with_dlpack):
    """A capsule of the right name on a class that is not the producer: the table's
    functions are called with an object they do not know, and must refuse it; no crash.
    (A capsule is trusted: the counting table's functions may be called, and fail.)"""
    if which == "torch":
        pytest.importorskip("torch")
    run_case(__file__, "case_foreign_capsule", which, with_dlpack)
