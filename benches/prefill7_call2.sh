#!/usr/bin/env bash
# Issue 41 item 3, session 7 (helper prefill7), device call 2: the leading attn_prefill_mma variants
# of call 1 and the cheaper swizzle in the harness (checks against float64, TFLOP/s, SASS), the
# candidates through kpc beside PyTorch's FA2/cuDNN, kpc attention --check with each candidate, and
# the mma prefill's tests on the device, in one call. From the project root on the GPU host:
#   source .gpu/prelude.sh; tar xf .gpu/prefill7-files.tar -C /tmp/p7; bash /tmp/p7/prefill7_call2.sh
set -uo pipefail
d=$(cd "$(dirname "$0")" && pwd)
export OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent
export HARNESS_C=$d/ocl_prefill_mma.c KERNEL_CL=$d/attn_prefill_mma.cl TORCH=$d/attention_torch.py \
  KPC=$d/kpc TESTS=$d/attention-test RUNS=${RUNS:-7}
k="-D ROW_BLOCKS=2 -D KEYS=32"
export VARIANTS="rb2k32|$k -D STAGES=1 -D HALF_EXP=0
s2|$k -D STAGES=2 -D HALF_EXP=0
s2-h1|$k -D STAGES=2 -D HALF_EXP=1
sw|$k -D STAGES=1 -D HALF_EXP=0 -D SWIZZLE=1
qsh|$k -D STAGES=1 -D HALF_EXP=0 -D SWIZZLE=1 -D Q_SHARED=1
qsh-h1|$k -D STAGES=1 -D HALF_EXP=1 -D SWIZZLE=1 -D Q_SHARED=1
s3sw-h1|$k -D STAGES=3 -D HALF_EXP=1 -D SWIZZLE=1
k16-qsh-s2-h1|-D ROW_BLOCKS=2 -D KEYS=16 -D STAGES=2 -D HALF_EXP=1 -D SWIZZLE=1 -D Q_SHARED=1
rb2k32-again|$k -D STAGES=1 -D HALF_EXP=0"
m="--prefill-kernel mma"
old="--mma-stages 1 --mma-half-exp 0"
s2h1="--mma-stages 2 --mma-half-exp 1"
qh1="--mma-stages 1 --mma-half-exp 1 --mma-swizzle true --mma-q-shared true"
export SWEEP_VARIANTS="old|opencl:gpu|$m $old
s2|opencl:gpu|$m --mma-stages 2 --mma-half-exp 0
s2h1 (new default)|opencl:gpu|
qsh|opencl:gpu|$m --mma-stages 1 --mma-half-exp 0 --mma-swizzle true --mma-q-shared true
qshh1|opencl:gpu|$m $qh1"
export CHECKS="f16 1 32 --device opencl:gpu;f16 4 32 --device opencl:gpu;f16 1 8 --device opencl:gpu;f16 4 8 --device opencl:gpu;f16 1 32 --device opencl:gpu $m $qh1;f16 4 8 --device opencl:gpu $m $qh1;f16 4 32 --device opencl:gpu $m $old"
HARNESS_BRIEF=1 SECTIONS=${SECTIONS:-"harness sass sweep check torch tests"} bash $d/ocl_prefill_mma_gpu.sh
