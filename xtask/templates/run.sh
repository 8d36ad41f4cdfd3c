#!/usr/bin/env bash
# Runs tensorbridge's GPU test binaries on a GPU machine without a Rust toolchain.
# TB_WRAP, when set, prefixes every binary (e.g. TB_WRAP="compute-sanitizer --tool memcheck
# --error-exitcode 9").
# Written by `cargo xtask test-gpu --bundle` from xtask/templates/run.sh. Usage:
# ./run.sh [ARGS...]; ARGS go to every test binary (for example --nocapture, or a test name
# filter). PYTEST_ARGS go to pytest; libpath.sh says how libraries are found.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=libpath.sh
. "$here/libpath.sh"
# Whether this bundle was built with --candle-cuda (the example extension's candle recipes and
# candle_gpu): test_gpu_candle.py skips, saying so, when it was not.
export TB_GPU_CANDLE="${TB_GPU_CANDLE:-@CANDLE@}"
# The binaries are stripped: error backtraces would be lists of <unknown>.
export RUST_LIB_BACKTRACE="${RUST_LIB_BACKTRACE:-0}"

echo "==> devices"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L || echo "nvidia-smi -L failed: no usable NVIDIA GPU"
    echo "driver version: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
else
    echo "nvidia-smi not found: no NVIDIA driver on this machine"
fi

binaries=(@BINARIES@)
passed=0
failed=0
# Binaries over 16 MiB travel gzipped (NAME.gz), so that the bundle stays small enough to carry:
# unpacked here, once.
for gz in "$here"/*.gz; do
    [ -e "$gz" ] || continue
    bin="${gz%.gz}"
    if [ ! -x "$bin" ] || [ "$gz" -nt "$bin" ]; then
        if ! { gzip -dc "$gz" >"$bin.part" && chmod +x "$bin.part" && mv "$bin.part" "$bin"; }; then
            echo "could not unpack $gz"
        fi
    fi
done
for bin in "${binaries[@]}"; do
    echo "==> $bin"
    # shellcheck disable=SC2086 # TB_WRAP is a command line, split on purpose.
    if ${TB_WRAP:-} "$here/$bin" "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAILED: $bin"
    fi
done

# The Python package: install the wheels next to the bundle (no index, no dependencies: the
# machine's environment has the frameworks) and run the GPU suite against it.
echo "==> python: tensorbridge wheel and the GPU pytest suite"
py="${PYTHON:-python3}"
tests="$here/@PYTHON_TESTS@"
# The GPU suite and the native smoke tests (their GPU half runs only where there is a GPU).
suites=("$tests/test_native_smoke.py")
[ -d "$tests/gpu" ] && suites+=("$tests/gpu")
rm -rf "$here/py" "$here/nixl"
if "$py" -m pip install -q --disable-pip-version-check --no-deps --no-index --find-links "$here" --target "$here/py" tensorbridge tensorbridge_example \
    && PYTHONPATH="$here/py${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest -q -p no:cacheprovider \
        --rootdir "$tests" "${suites[@]}" --ignore "$tests/gpu/test_gpu_nixl.py" ${PYTEST_ARGS:-}; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAILED: python GPU suite"
fi
# NIXL travels apart from the bundle (its wheels carry NVIDIA modules that may not be
# redistributed): a folder of nixl-cu13 wheels named by TB_NIXL_WHEELS is installed beside the
# bundle and its tests run in a pytest process of their own (NIXL's UCX hooks CUDA's allocator
# in the process that makes an agent), where they must run (TB_REQUIRE_NIXL=1); without it
# they skip, saying so.
echo "==> python: NIXL across two GPUs (test_gpu_nixl.py)"
nixl_path=""
if [ -n "${TB_NIXL_WHEELS:-}" ]; then
    if "$py" -m pip install -q --disable-pip-version-check --no-deps --no-index --find-links "$TB_NIXL_WHEELS" --target "$here/nixl" nixl-cu13; then
        nixl_path="$here/nixl"
        echo "NIXL: installed from $TB_NIXL_WHEELS into $here/nixl"
    else
        echo "NIXL: could not install nixl-cu13 from TB_NIXL_WHEELS=$TB_NIXL_WHEELS; its tests will fail"
    fi
    nixl_env=(TB_REQUIRE_NIXL=1 "UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}")
else
    echo "NIXL: TB_NIXL_WHEELS is not set (a folder holding the nixl-cu13 wheel for this Python); these tests skip"
    nixl_env=()
fi
if env "${nixl_env[@]}" PYTHONPATH="$here/py${nixl_path:+:$nixl_path}${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest -q -p no:cacheprovider \
        --rootdir "$tests" "$tests/gpu/test_gpu_nixl.py" ${PYTEST_ARGS:-}; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAILED: python NIXL GPU tests"
fi
# The sharing tests that CI runs on the stand-in driver, here on the real one, in a process of
# their own as in CI: a process reports a dead consumer on stderr once, and the GPU suite's
# killed-consumer test reads that report.
echo "==> python: the sharing tests on the real driver"
if PYTHONPATH="$here/py${PYTHONPATH:+:$PYTHONPATH}" "$py" -m pytest -q -p no:cacheprovider \
        --rootdir "$tests" "$tests/test_share_driver.py" "$tests/test_share_trust.py" "$tests/test_nixl_driver.py" ${PYTEST_ARGS:-}; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAILED: python sharing tests on the real driver"
fi
echo "GPU bundle: ${#binaries[@]} binaries and three Python suites, $passed passed, $failed failed"
[ "$failed" -eq 0 ]
