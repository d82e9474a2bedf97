#!/usr/bin/env bash
# Build FlashInfer 0.7.2.post1's fa3 prefill kernel (batch_prefill_..._f16qk_False_sm90, the module both
# prefill-fa3 and ragged-fa3 load) on this machine, without a GPU, and put it into the bundle's aot/ folder so the
# device loads it instead of compiling it. Run from the project root after ../shared/gpu/prepare.sh 0.7.2.post1 and
# `mv .whl .whl-0.7.2`; needs the CUDA 13.0 toolkit (nvcc) that this machine has; about 6 minutes on 2 cores.
#
# Why: on the device the JIT build failed with "Ninja build failed". The cause is the bundle, not the machine:
# prepare.sh trims flashinfer/data/cutlass/tools from the 0.7.2 wheel, and the sm90 kernels include
# cutlass/util/command_line.h from cutlass/tools/util/include. This script restores those headers (in the bundle too,
# as dl/zz-cutlass-util-include.zip, for other JIT builds on the device) and adds what a GPU-less toolkit lacks:
# cuRAND's headers (from the nvidia-curand wheel) and a stub libcuda.so to link against (the module resolves driver
# entry points at run time through cudaGetDriverEntryPointByVersion; it does not keep a libcuda dependency).
set -euo pipefail
B=${BUILD_DIR:-/tmp/fa3build}
BUNDLE=${BUNDLE:-$PWD/.whl-0.7.2}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export CUDA_HOME
PY=${PYTHON:-$PWD/.venv/bin/python}  # a Python with torch (the CPU build is enough)
mkdir -p "$B"/dl "$B"/site "$B"/py "$B"/curand
get() { python3 -m pip download -q --no-deps --only-binary=:all: -d "$@"; }
# FlashInfer and tvm-ffi as the device gets them (tvm-ffi for this machine's Python, to generate the sources)
[ -f "$B/site/.done" ] || { for f in "$BUNDLE"/dl/*; do python3 -m zipfile -e "$f" "$B/site" >/dev/null; done; touch "$B/site/.done"; }
pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
get "$B/py" "apache-tvm-ffi==$(ls "$BUNDLE"/dl | sed -n 's/^apache_tvm_ffi-\([^-]*\)-.*/\1/p')" \
  --python-version "$pyver"
python3 -m zipfile -e "$B"/py/apache_tvm_ffi-*.whl "$B/py" >/dev/null
python3 -m pip install -q --target "$B/py" requests tqdm numpy packaging nvidia-ml-py
# the headers the trimmed wheel dropped, taken from the full wheel, into the build tree and the bundle
get "$B/dl" --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 flashinfer-python==0.7.2.post1
python3 - "$B" "$BUNDLE" <<'PY'
import sys, zipfile, glob
b, bundle = sys.argv[1], sys.argv[2]
prefix = "flashinfer/data/cutlass/tools/util/include/"
src = zipfile.ZipFile(glob.glob(f"{b}/dl/flashinfer_python-0.7.2.post1-*.whl")[0])
names = [n for n in src.namelist() if n.startswith(prefix) and not n.endswith("/")]
with zipfile.ZipFile(f"{bundle}/dl/zz-cutlass-util-include.zip", "w", zipfile.ZIP_DEFLATED) as out:
    for n in names:
        src.extract(n, f"{b}/site")
        out.writestr(n, src.read(n))
print(f"{len(names)} cutlass/util headers restored")
PY
# cuRAND headers and a link-time libcuda stub, if the toolkit has none
if [ ! -f "$CUDA_HOME/include/curand_kernel.h" ]; then
  get "$B/curand" --platform manylinux_2_27_x86_64 --python-version 3.12 "nvidia-curand>=10.4,<10.5"
  python3 -m zipfile -e "$B"/curand/nvidia_curand-*.whl "$B/curand/x"
  cp "$B"/curand/x/nvidia/cu13/include/curand*.h "$CUDA_HOME/include/"
fi
if [ ! -e "$CUDA_HOME/lib64/stubs/libcuda.so" ]; then
  mkdir -p "$CUDA_HOME/lib64/stubs" && : >"$B/stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CUDA_HOME/lib64/stubs/libcuda.so" "$B/stub.c"
fi
# generate and build the module exactly as FlashInfer's JIT would on an H100 (sm_90a)
FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=${MAX_JOBS:-2} FLASHINFER_WORKSPACE_BASE="$B/ws" PYTHONPATH="$B/py:$B/site" \
  "$PY" - <<'PY'
import time, torch
from flashinfer.jit.attention.modules import gen_batch_prefill_module
spec = gen_batch_prefill_module("fa3", torch.float16, torch.float16, torch.float16, torch.int32, 128, 128, 0,
                                False, False, False)
t = time.time()
spec.build(verbose=False)
print(f"built {spec.name} in {time.time() - t:.0f}s")
PY
so=$(find "$B/ws" -path '*cached_ops*' -name '*_sm90.so' | head -1)
mkdir -p "$BUNDLE/aot" && cp "$so" "$BUNDLE/aot/"
readelf -d "$so" | grep NEEDED
echo "copied $(basename "$so") into $BUNDLE/aot"
