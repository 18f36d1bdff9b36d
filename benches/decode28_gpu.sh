#!/usr/bin/env bash
# Issue 28 on the GPU host: decode host cost and GQA decode. One call: every decode shape of the
# issue with the Vulkan submit profile on (wall, device and host µs per step, and where the host time
# of a submission goes), a GQA decode sweep, and PyTorch's GQA decode in the same call.
#   source .gpu/prelude.sh; .gpu/decode28_gpu.sh
# SECTIONS: any of shapes sweep check torch (default all). KPC: the kpc binary (default .gpu/kpc).
# SHAPES: B:Hkv:L triples; SWEEP_L, VARIANTS: the sweep's (see below). KPC_VULKAN_DEFER passes through.
set -uo pipefail
KPC=${KPC:-.gpu/kpc}
sections=${SECTIONS:-shapes sweep check torch}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
for s in $sections; do
  case $s in
    shapes)
      echo "## decode shapes (vulkan:gpu), submit profile on"
      for shp in ${SHAPES:-1:32:1024 1:32:4096 1:32:16384 1:32:32768 1:8:1024 1:8:4096 1:8:16384 1:8:32768 4:32:1024 4:32:4096 4:32:16384 4:32:32768}; do
        IFS=: read -r b hkv L <<<"$shp"
        all=$(KPC_VULKAN_SUBMIT_PROFILE=1 "$KPC" attention --device vulkan:gpu --heads 32 --head-dim 128 \
          --batch "$b" --kv-heads "$hkv" --prompt "$L" --steps 50 --fill ${EXTRA:-} 2>&1)
        echo "# B=$b Hkv=$hkv L=$L"
        grep -E '^bench: phase=decode|submit profile|^host:' <<<"$all" || tail -3 <<<"$all"
      done
      ;;
    sweep)
      echo "## GQA decode sweep (vulkan:gpu, B=1 Hkv=8): workgroups:local:rows:spread:split_min[:cyclic]"
      for L in ${SWEEP_L:-4096 16384 32768}; do
        for v in ${VARIANTS:-1024:128:4:false:128 2048:128:4:false:128 512:128:4:false:128 1024:128:8:false:128 1024:256:4:false:128 1024:64:4:false:128 1024:128:4:false:64 1024:128:4:false:256 1024:128:4:true:128 1024:128:4:false:128:true}; do
          IFS=: read -r w loc rows spread split cyc <<<"$v"
          o=$("$KPC" attention --device vulkan:gpu --heads 32 --head-dim 128 --kv-heads 8 --prompt "$L" \
            --steps 50 --fill --workgroups "$w" --decode-local "$loc" --decode-rows "$rows" \
            --decode-spread "$spread" --decode-split-min "$split" ${cyc:+--decode-cyclic "$cyc"} 2>&1 | grep '^bench: phase=decode')
          echo "L=$L $v $(grep -o 'device_us=[^ ]*\|wall_us=[^ ]*\|splits=[^ ]*' <<<"$o" | tr '\n' ' ')"
        done
      done
      ;;
    check)
      echo "## checks"
      "$KPC" attention --device vulkan:gpu --heads 32 --head-dim 128 --kv-heads 8 --batch 2 --prompt 3000 --steps 20 --check 2>&1 | grep -iE 'check|error|pass|fail' | head -5
      "$KPC" attention --device vulkan:gpu --heads 32 --head-dim 128 --prompt 1000 --steps 20 --check 2>&1 | grep -iE 'check|error|pass|fail' | head -5
      ;;
    torch)
      echo "## PyTorch GQA decode"
      python3 "$(dirname "$0")/attention_torch.py" --batch 1 --kv-heads 8 --decode 1024,4096,16384,32768 --prefill "" 2>&1 | tail -20
      ;;
  esac
done
