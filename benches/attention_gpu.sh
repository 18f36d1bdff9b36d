#!/usr/bin/env bash
# One call on the GPU host: kpc's attention on Vulkan and on OpenCL (the GPU device of each), and
# PyTorch's SDPA on the same shapes, in the same session, so ratios compare like with like. Builds
# nothing. Full logs go to $OUT (or /tmp); the tables are printed.
#   source .gpu/prelude.sh; SECTIONS="vulkan torch" benches/attention_gpu.sh
# SECTIONS: any of vulkan opencl sweep tiled torch (default vulkan opencl torch). KPC: the kpc binary (default .gpu/kpc).
set -uo pipefail
export KPC=${KPC:-.gpu/kpc}
out=${OUT:-/tmp}
sections=${SECTIONS:-vulkan opencl torch}
here=$(dirname "$0")
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
for s in $sections; do
  case $s in
    vulkan | opencl)
      echo "## kpc $s"
      start=$(date +%s)
      "$here/attention.sh" --device "$s:gpu" 2>&1 | tee "$out/attention-$s.txt"
      echo "($s: $(( $(date +%s) - start )) s)"
      ;;
    sweep)
      # Decode variants at a few shapes: workgroup target, workgroup size, rows in flight, spread
      # over query heads, and (optional fifth field) the fewest positions per split.
      echo "## kpc ${SWEEP_DEVICE:-vulkan:gpu} decode sweep"
      echo "| B | Hkv | L | workgroups | local | rows | spread | split min | splits | device µs | µs per launch | device / copy |"
      echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
      for shp in ${SWEEP_SHAPES:-1:32:4096 1:8:16384 4:32:16384 16:32:4096}; do
        IFS=: read -r b hkv L <<<"$shp"
        for v in ${SWEEP_VARIANTS:-1024:128:4:false 2048:128:4:false 1024:128:8:false 1024:128:4:true 2048:128:4:true}; do
          IFS=: read -r w loc rows spread split <<<"$v"
          all=$("$KPC" attention --device "${SWEEP_DEVICE:-vulkan:gpu}" --heads 32 --head-dim 128 --batch "$b" \
            --kv-heads "$hkv" --prompt "$L" --steps 50 --fill --workgroups "$w" --decode-local "$loc" \
            --decode-rows "$rows" --decode-spread "$spread" ${split:+--decode-split-min "$split"} 2>&1)
          o=$(grep '^bench: phase=decode' <<<"$all") || echo "failed: $(tail -1 <<<"$all")" >&2
          v1() { grep -o " $1=[^ ]*" <<<"$o" | cut -d= -f2; }
          echo "| $b | $hkv | $L | $w | $loc | $rows | $spread | ${split:-default} | $(v1 splits) | $(v1 device_us) |" \
            "$(v1 launches_us) | $(v1 pct_device)% |"
        done
      done 2>&1 | tee "$out/attention-sweep.txt"
      ;;
    tiled)
      # The scalar (tiled) prefill with and without its staging prefetch, on both backends, with the
      # driver's statistics for each build (registers, local memory).
      echo "## kpc tiled prefill: prefetch on and off"
      echo "| backend | L | prefetch | ms | TFLOP/s | driver statistics |"
      echo "|---|---|---|---|---|---|"
      for dev in ${TILED_DEVICES:-vulkan:gpu opencl:gpu}; do
        for L in ${TILED_L:-2048 4096 8192}; do
          for pf in true false; do
            all=$("$KPC" attention --device "$dev" --heads 32 --head-dim 128 --kv f16 --prompt "$L" \
              --steps 0 --prefill-kernel tiled --tiled-prefetch "$pf" --prefill-runs 3 2>&1)
            echo "$all" >>"$out/attention-tiled-raw.txt"
            o=$(grep '^bench: phase=prefill' <<<"$all")
            v1() { grep -o " $1=[^ ]*" <<<"$o" | cut -d= -f2; }
            st=$(grep -A1 '^  attn_prefill_tiled' <<<"$all" | grep -o 'Register Count=[0-9]*\|Local Memory Size=[0-9]*' | tr '\n' ' ')
            echo "| ${dev%%:*} | $L | $pf | $(v1 ms) | $(v1 tflops) | $st |"
          done
        done
      done 2>&1 | tee "$out/attention-tiled.txt"
      ;;
    torch)
      echo "## PyTorch SDPA"
      start=$(date +%s)
      for sh in ${TORCH_SHAPES:-1:32 1:8 4:32 16:32}; do
        b=${sh%%:*} hkv=${sh##*:}
        pre=""
        [ "$sh" = "1:32" ] && pre=${TORCH_PREFILL:-512,1024,2048,4096,8192}
        dec=1024,4096,16384,32768
        [ "$b" -ge 16 ] && dec=1024,4096,16384
        python3 "$here/attention_torch.py" --batch "$b" --kv-heads "$hkv" --decode "$dec" --prefill "$pre"
      done 2>&1 | tee "$out/attention-torch.txt"
      echo "(torch: $(( $(date +%s) - start )) s)"
      ;;
  esac
done
