#!/usr/bin/env bash
# Runs tensorbridge's benches on a GPU machine without a Rust toolchain: the criterion
# groups (CPU and GPU) pinned to one core, copy_vs_share, the Python comparison, and a GPU
# tensor handed to another process (tensorbridge vs torch.multiprocessing vs a pinned copy),
# and NIXL across two GPUs (with TB_NIXL_WHEELS: tensorbridge + NIXL vs NIXL by hand vs NCCL).
# Written by `cargo xtask test-gpu --bundle` from xtask/templates/bench.sh.
# Usage: ./bench.sh [CRITERION ARGS...]; libpath.sh says how libraries are found.
# TB_BENCH_CPU picks the core (default 5); results go to $OUT (default ./bench-out).
# Address-space randomisation is off where `setarch -R` works: nanosecond groups moved by
# 10-40% between runs with it on (where the stack and heap land decides which copies alias
# or miss store forwarding), and were steady with it off.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=libpath.sh
. "$here/libpath.sh"
out="${OUT:-$here/bench-out}"
mkdir -p "$out"
cpu="${TB_BENCH_CPU:-5}"
pin() {
    if setarch -R true 2>/dev/null; then setarch -R taskset -c "$cpu" "$@"; else taskset -c "$cpu" "$@"; fi
}
aslr="on"; setarch -R true 2>/dev/null && aslr="off"
echo "==> host: $(lscpu | sed -n 's/^Model name: *//p'), benches pinned to core $cpu, ASLR $aslr"
for b in core dlpack cai ndarray candle tch cudarc; do
    [ -x "$here/benches/$b" ] || continue
    echo "==> bench $b"
    CRITERION_HOME="$out/criterion" pin "$here/benches/$b" --bench "$@"
done
echo "==> copy_vs_share"
OUT="$out" pin "$here/benches/copy_vs_share"
python3 "$here/benches/plot_copy_vs_share.py" "$out/copy_vs_share.csv" "$out/copy_vs_share.svg"
echo "==> python comparison"
py="${PYTHON:-python3}"
if [ ! -d "$here/py" ]; then
    "$py" -m pip install -q --disable-pip-version-check --no-deps --no-index --find-links "$here" --target "$here/py" tensorbridge tensorbridge_example
fi
OUT="$out" PYTHONPATH="$here/py${PYTHONPATH:+:$PYTHONPATH}" pin "$py" "$here/benches/compare.py"
echo "==> sharing with another process (ipc.py)"
OUT="$out" PYTHONPATH="$here/py${PYTHONPATH:+:$PYTHONPATH}" pin "$py" "$here/benches/ipc.py"
echo "==> NIXL across two GPUs (nixl.py)"
# NIXL from the folder of wheels TB_NIXL_WHEELS (installed by run.sh, or here); skipped, saying
# so, without it or without two GPUs. Not pinned to one core: two processes and NCCL.
if [ -n "${TB_NIXL_WHEELS:-}" ] && [ ! -d "$here/nixl" ]; then
    "$py" -m pip install -q --disable-pip-version-check --no-deps --no-index --find-links "$TB_NIXL_WHEELS" --target "$here/nixl" nixl-cu13
fi
if [ -d "$here/nixl" ]; then
    OUT="$out" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" PYTHONPATH="$here/py:$here/nixl${PYTHONPATH:+:$PYTHONPATH}" "$py" "$here/benches/nixl.py"
else
    echo "skipped: TB_NIXL_WHEELS is not set (a folder holding the nixl-cu13 wheel for this Python)"
fi
echo "==> the table of conversions against their peers (table.py)"
# The same table `cargo xtask bench` writes into docs/BENCHMARKS.md (latest run), here
# with the Python rows of compare.json too; saved as $out/table.txt.
"$py" "$here/benches/table.py" --criterion "$out/criterion" --compare "$out/compare.json" \
    --title "bench.sh on $(hostname) ($(lscpu | sed -n 's/^Model name: *//p'); $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)), $(date -u +%Y-%m-%d), pinned to core $cpu, ASLR $aslr; criterion medians, rank 1 / 2 / 4 / 8" \
    | tee "$out/table.txt"
