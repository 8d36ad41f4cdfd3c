# Sourced by run.sh and bench.sh: where the bundle's binaries find libtorch, libcuda and the
# CUDA toolkit on this machine (written by `cargo xtask test-gpu --bundle`).
#
# TB_GPU_LD_LIBRARY_PATH, when set, is used as it is. Otherwise the directories are found here:
# libtorch next to the `torch` package of $PYTHON (default python3), the CUDA libraries PyTorch
# runs on (pip's NVIDIA wheels beside it, `nvidia/cu13/lib`), libcuda where the dynamic linker
# or the NVIDIA container runtime put it, and the CUDA toolkit's lib64. Whatever
# LD_LIBRARY_PATH already held comes after. PyTorch's libraries come before the toolkit's so
# that what candle links (cuBLAS, cuRAND, the CUDA runtime: `candle_gpu` and the example
# extension's candle build) is the very library PyTorch loads, whichever is imported first.
tb_found=""
tb_add() { [ -d "$1" ] && tb_found="${tb_found:+$tb_found:}$1"; }
if [ -n "${TB_GPU_LD_LIBRARY_PATH:-}" ]; then
    tb_found="$TB_GPU_LD_LIBRARY_PATH"
else
    tb_torch="$("${PYTHON:-python3}" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null || true)"
    if [ -n "$tb_torch" ]; then
        tb_add "$tb_torch"
        tb_add "$(dirname "$(dirname "$tb_torch")")/nvidia/cu13/lib"
    fi
    tb_cuda_so="$(ldconfig -p 2>/dev/null | sed -n 's/.*libcuda\.so\.1 .*=> \(.*\)$/\1/p' | head -n 1)"
    if [ -n "$tb_cuda_so" ]; then tb_add "$(dirname "$tb_cuda_so")"; fi
    tb_add /usr/local/nvidia/lib64
    tb_add "${CUDA_HOME:-/usr/local/cuda}/lib64"
fi
export LD_LIBRARY_PATH="$tb_found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "==> LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
