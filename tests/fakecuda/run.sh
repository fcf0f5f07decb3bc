#!/usr/bin/env bash
# tests/fakecuda/run.sh — runs tests/test_gpt2_cuda.c on a machine WITHOUT a
# GPU, against a host emulation of the CUDA runtime and cuBLASLt.
#
#   tests/fakecuda/run.sh [test_name]        (FAKE_GEMM_F32=1: see below)
#
# What it checks: the logic of src/model/gpt2_cuda.cu — indexing, the
# row-major -> column-major cuBLASLt translation (the emulated cublasLtMatmul
# enforces the documented shape rules, ld >= rows, batch counts, the
# alignments declared to the heuristic, and that every operand lies inside
# one cudaMalloc'd buffer), stream/staging discipline (async copies must use
# pinned host memory), and the loss/gradients against the CPU reference. Every
# kernel runs on 256 host threads per block in lockstep (barriers for
# __syncthreads and for each warp's __shfl_xor_sync); blocks run one after
# another. Device memory starts as NaN bytes, so an unwritten output shows.
# Built with AddressSanitizer and UBSan.
#
# What it cannot check: anything about the real GPU — timing, races between
# blocks (they never overlap here), the real cuBLASLt's algorithms, FMA
# contraction, CUDA's expf. The emulated GEMM sums in double; with
# FAKE_GEMM_F32=1 it sums in fp32 (FMA, reverse order), a stand-in for a
# different summation order, to see how close the tolerances are.
#
# The .cu file is turned into C++ by rewriting each `kernel<<<cfg>>>(args)`
# into `fake_launch(lambda, cfg, args)`; nothing in the source is changed.
# Slow (barriers): test_loss_at_init_and_speed takes many minutes; the
# others take seconds to a minute.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${FAKECUDA_BUILD:-/tmp/zpp-fakecuda}
mkdir -p "$out"
python3 - "$root/src/model/gpt2_cuda.cu" "$out/gpt2_cuda_fake.cpp" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
s, n = re.subn(r'(\w+)<<<(.+?)>>>\(', r'fake_launch([&](auto&&... a_) { \1(a_...); }, \2, ', s,
               flags=re.S)
assert n > 0, "no kernel launches found"
open(sys.argv[2], 'w').write(s)
PY
san="-fsanitize=address,undefined -fno-omit-frame-pointer"
ob=$(ls -d /usr/include/x86_64-linux-gnu/openblas* /usr/include/openblas 2>/dev/null | head -1 || true)
inc="-I$here/include -I$root/src -I$root/include -I$root/tests ${ob:+-I$ob}"
g++ -std=c++17 -O1 -g $san -Wall -Wextra -Wno-unused-parameter -I"$here/include" \
    -c "$here/fakecuda.cpp" -o "$out/fakecuda.o"
g++ -std=c++17 -O1 -g $san -Wall -Wextra -Wno-unused-parameter $inc -DZPP_HAVE_CUDA=1 \
    -c "$out/gpt2_cuda_fake.cpp" -o "$out/gpt2_cuda_fake.o"
objs="$out/fakecuda.o $out/gpt2_cuda_fake.o"
for f in src/core/error.c src/core/dtype.c src/core/random.c src/core/mem.c \
         src/model/gpt2_cpu.c tests/testlib.c tests/test_gpt2_cuda.c; do
    o="$out/$(basename "$f").o"
    gcc -std=c11 -O1 -g $san -Wall -Wextra -Werror -Wno-unused-parameter \
        -D_POSIX_C_SOURCE=200809L -DZPP_HAVE_CUDA=1 $inc -c "$root/$f" -o "$o"
    objs="$objs $o"
done
g++ $san -o "$out/test_gpt2_cuda_fake" $objs -lopenblas -lpthread -lm
OPENBLAS_NUM_THREADS=1 "$out/test_gpt2_cuda_fake" "$@"
