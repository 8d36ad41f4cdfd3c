"""pytest set-up shared by the CPU suite (this folder) and the GPU suite (``gpu/``).

- Puts this folder on ``sys.path`` so both suites import ``tbhelpers`` and ``frameworks``.
- Quietens TensorFlow's C++ logging and turns on JAX's 64-bit types before either is imported
  (without ``jax_enable_x64`` JAX silently narrows float64/int64 imports, i.e. copies).
- Frameworks are imported lazily by the tests (``pytest.importorskip``), so a missing one
  skips only the tests that need it. tensorbridge itself is never skipped: it is what is
  under test, so a missing wheel is a failure.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_ENABLE_X64", "1")
# JAX on a GPU machine would otherwise take 75 % of the GPU memory at its first use
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import pytest  # noqa: E402

# NIXL cannot be loaded after TensorFlow (both bundle gRPC; the process exits), and the report
# header below imports TensorFlow: where the NIXL tests must run (`TB_REQUIRE_NIXL=1`), NIXL is
# loaded first. A failure here is left to those tests to report.
if os.environ.get("TB_REQUIRE_NIXL") == "1":
    try:
        import tensorbridge.nixl

        tensorbridge.nixl.import_nixl()
    except ImportError:
        pass


def pytest_report_header(config):
    """One line per framework found, so a run's log says what was (not) exercised."""
    import importlib

    lines = []
    for mod in ("tensorbridge", "numpy", "ml_dtypes", "torch", "jax", "tensorflow", "cupy", "numba", "cuda.core"):
        try:
            m = importlib.import_module(mod)
            lines.append(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception as e:  # noqa: BLE001 - any import failure is reported, not raised
            lines.append(f"{mod} absent ({type(e).__name__})")
    return "frameworks: " + ", ".join(lines)


@pytest.fixture(scope="session")
def tb():
    import tensorbridge

    return tensorbridge
