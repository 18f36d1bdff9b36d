#!/usr/bin/env bash
# One call on the GPU host for the VK_NV_cooperative_matrix2 prefill (issue 28): the device's
# features, the attention tests (when kpc-attention's test binary, target/release/deps/main-*, is
# packed as .gpu/attention-test), the cm2 kernel checked against the float64 reference (B=1 and 4,
# MHA and GQA, scaled queries; fp32 K/V resolved by Auto and refused when forced), then causal
# prefill TFLOP/s at L=2k/4k/8k for cm2 tile variants, the KHR cooperative-matrix kernel and
# PyTorch SDPA, in the same session. Builds nothing.
#   source .gpu/prelude.sh; benches/cm2_gpu.sh
# The kpc binary, the test binary (attention-test) and attention_torch.py are taken from the
# script's own folder where they are there (a packed folder), else from .gpu/ and benches/.
# CM2_VARIANTS: rows:keys:invocations triples (default 64:64:128 128:64:256 128:32:256 64:32:128 64:128:128 128:128:256).
# CM2_L: prompt lengths (default 2048 4096 8192). KPC: the kpc binary (default .gpu/kpc).
set -uo pipefail
here=$(dirname "$0")
pick() { if [ -e "$here/$1" ]; then echo "$here/$1"; else echo "$2"; fi; }
K=${KPC:-$(pick kpc .gpu/kpc)}
T=$(pick attention-test .gpu/attention-test)
torch=$(pick attention_torch.py benches/attention_torch.py)
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
"$K" devices 2>&1 | grep -E '^ *(vulkan|opencl)|limits' | head -8

if [ -x "$T" ]; then
  echo "## attention tests (Vulkan)"
  "$T" vulkan::cm2 vulkan::coop vulkan::prefill vulkan::chunked --test-threads 4 2>&1 | grep -E '^test |test result|panicked|error' | tail -25
fi

echo "## checks (cm2 forced unless noted)"
base="--device vulkan:gpu --head-dim 128 --steps 2 --check"
for c in "--batch 1 --heads 32 --prompt 1000 --kv f16 --prefill-kernel cm2" \
         "--batch 4 --heads 32 --prompt 515 --kv f16 --prefill-kernel cm2" \
         "--batch 1 --heads 32 --kv-heads 8 --prompt 1000 --kv f16 --prefill-kernel cm2" \
         "--batch 4 --heads 32 --kv-heads 8 --prompt 333 --kv f16 --prefill-kernel cm2 --q-scale 8" \
         "--batch 1 --heads 32 --kv-heads 8 --prompt 1000 --kv f16 --prefill-kernel cm2 --cm2-rows 128 --cm2-local 256" \
         "--batch 1 --heads 32 --kv-heads 8 --prompt 1000 --kv f16" \
         "--batch 1 --heads 32 --kv-heads 8 --prompt 1000 --kv f32" \
         "--batch 1 --heads 32 --prompt 100 --kv f32 --prefill-kernel cm2"; do
  all=$("$K" attention $base $c 2>&1)
  echo "$all" >>"$out/cm2-checks.txt"
  echo "$c => $(grep -o 'prefill: [A-Za-z0-9]*[^)]*' <<<"$all" | head -1) | $(grep -E '^check:|^kpc: ' <<<"$all" | tail -1)"
done

echo "## prefill TFLOP/s (B=1 H=32 D=128 causal fp16 K/V, median of 5)"
echo "| kernel | tile | L | ms | TFLOP/s | driver statistics |"
echo "|---|---|---|---|---|---|"
for L in ${CM2_L:-2048 4096 8192}; do
  for v in ${CM2_VARIANTS:-64:64:128 128:64:256 128:32:256 64:32:128 64:128:128 128:128:256} khr; do
    if [ "$v" = khr ]; then
      args="--prefill-kernel cooperative"; name=khr; tile="128 rows"
    else
      IFS=: read -r r k l <<<"$v"
      args="--prefill-kernel cm2 --cm2-rows $r --cm2-keys $k --cm2-local $l"; name=cm2; tile="$r x $k / $l"
    fi
    all=$("$K" attention --device vulkan:gpu --heads 32 --head-dim 128 --kv f16 --prompt "$L" --steps 0 \
      --prefill-runs 5 $args 2>&1)
    echo "$all" >>"$out/cm2-bench-raw.txt"
    o=$(grep '^bench: phase=prefill' <<<"$all") || { echo "| $name | $tile | $L | failed: $(tail -1 <<<"$all") |"; continue; }
    v1() { grep -o " $1=[^ ]*" <<<"$o" | cut -d= -f2; }
    st=$(grep -A3 '^  attn_prefill_' <<<"$all" | grep -o 'Register Count=[0-9]*\|Local Memory Size=[0-9]*\|Shared Memory Size=[0-9]*' | sort -u | tr '\n' ' ')
    echo "| $name | $tile | $L | $(v1 ms) | $(v1 tflops) | $st |"
  done
done

echo "## PyTorch SDPA"
python3 "$torch" --batch 1 --heads 32 --head-dim 128 --decode "" --prefill 2048,4096,8192 2>&1 | tail -20
