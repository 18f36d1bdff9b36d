#!/usr/bin/env bash
# Issue 41 item 3, session 7 (helper prefill7), device call 1: every attn_prefill_mma variant in the
# harness (checks against float64, TFLOP/s at L = 2k/4k/8k), their SASS, the leading ones through
# kpc, and PyTorch's FA2/cuDNN, in one call. From the project root on the GPU host, with the files
# copied flat into .gpu/ as prefill7-*:
#   source .gpu/prelude.sh; bash .gpu/prefill7-prefill7_call1.sh
# It ran with the kernel of commit 845ee65, whose defaults were STAGES=1 HALF_EXP=0 (variants that
# name neither ran with those), and its slower swizzle (each offset XORed per load); kpc's defaults
# then were the same.
set -uo pipefail
g=.gpu
export OCL_ICD_FILENAMES=libnvidia-opencl.so.1 OCL_ICD_VENDORS=/nonexistent
xz -dc $g/prefill7-kpc.xz >/tmp/kpc && chmod +x /tmp/kpc
export HARNESS_C=$g/prefill7-ocl_prefill_mma.c KERNEL_CL=$g/prefill7-attn_prefill_mma.cl \
  TORCH=$g/prefill7-attention_torch.py KPC=/tmp/kpc RUNS=${RUNS:-7}
k="-D KEYS=32"
export VARIANTS="rb2k32|-D ROW_BLOCKS=2 $k
rb2k32-kpcopts|-cl-kernel-arg-info -D KV_F16=1u -D ROW_BLOCKS=2u -D KEYS=32u -D WARPS=4u -D LAZY_RESCALE=1u
rb1k32|-D ROW_BLOCKS=1 $k
rb1k32-kpcopts|-cl-kernel-arg-info -D KV_F16=1u -D ROW_BLOCKS=1u -D KEYS=32u -D WARPS=4u -D LAZY_RESCALE=1u
rb2k32-sw|-D ROW_BLOCKS=2 $k -D SWIZZLE=1
rb2k32-s2|-D ROW_BLOCKS=2 $k -D STAGES=2
rb2k32-s2sw|-D ROW_BLOCKS=2 $k -D STAGES=2 -D SWIZZLE=1
rb2k32-s3sw|-D ROW_BLOCKS=2 $k -D STAGES=3 -D SWIZZLE=1
rb2k32-qsh|-D ROW_BLOCKS=2 $k -D Q_SHARED=1 -D SWIZZLE=1
rb2k32-h1|-D ROW_BLOCKS=2 $k -D HALF_EXP=1
rb2k32-h2|-D ROW_BLOCKS=2 $k -D HALF_EXP=2
rb2k32-s2sw-h1|-D ROW_BLOCKS=2 $k -D STAGES=2 -D SWIZZLE=1 -D HALF_EXP=1
rb2k32-qsh-h1|-D ROW_BLOCKS=2 $k -D Q_SHARED=1 -D SWIZZLE=1 -D HALF_EXP=1
rb1k32-s2|-D ROW_BLOCKS=1 $k -D STAGES=2
rb1k32-s3sw|-D ROW_BLOCKS=1 $k -D STAGES=3 -D SWIZZLE=1
rb1k32-s2sw-h1|-D ROW_BLOCKS=1 $k -D STAGES=2 -D SWIZZLE=1 -D HALF_EXP=1
rb1k64|-D ROW_BLOCKS=1 -D KEYS=64
rb1k64-qsh|-D ROW_BLOCKS=1 -D KEYS=64 -D Q_SHARED=1 -D SWIZZLE=1
rb1w8k32-qsh|-D ROW_BLOCKS=1 -D WARPS=8 $k -D Q_SHARED=1 -D SWIZZLE=1
rb1w8k32-qsh-h1|-D ROW_BLOCKS=1 -D WARPS=8 $k -D Q_SHARED=1 -D SWIZZLE=1 -D HALF_EXP=1
rb2k32-again|-D ROW_BLOCKS=2 $k"
m="--prefill-kernel mma"
export SWEEP_VARIANTS="default|opencl:gpu|$m
rb1k32|opencl:gpu|$m --mma-row-blocks 1
s2sw|opencl:gpu|$m --mma-stages 2 --mma-swizzle true
s3sw|opencl:gpu|$m --mma-stages 3 --mma-swizzle true
qsh|opencl:gpu|$m --mma-q-shared true --mma-swizzle true
h1|opencl:gpu|$m --mma-half-exp 1
rb1s2|opencl:gpu|$m --mma-row-blocks 1 --mma-stages 2"
HARNESS_BRIEF=1 SECTIONS=${SECTIONS:-"harness sass sweep torch"} bash $g/prefill7-ocl_prefill_mma_gpu.sh
