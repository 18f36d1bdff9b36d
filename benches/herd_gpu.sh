#!/usr/bin/env bash
# Issue 29, item 4, measured before changing anything: N cold `kpc attention` processes started at once
# on ONE empty cache dir (the disk cache's per-key lock makes one of them build each kernel; the others
# wait and load it), against one cold process alone, and N / 1 processes that only open the device
# (`kpc bench-start --phase floor`), so the device opening's own contention is visible. Per kernel
# acquisition, from every process's report: the source (built by this process; disk = waited for
# another's build, then loaded) and its time. Driver caches off (source .gpu/prelude.sh first).
#   source .gpu/prelude.sh; .gpu/herd_gpu.sh            (after ../shared/gpu/pack.sh benches/herd_gpu.sh)
# Variables: KPC (default .gpu/kpc), N (8), ROUNDS (3), DEVICES ("vulkan:gpu opencl:gpu"), ARGS (the
# attention arguments; issue 45 item 5 uses "--heads 32 --head-dim 128 --prompt 1024 --steps 4").
# Per process of each herd, the breakdown line: wall, the kernel acquisitions' sum (waiting for the
# builder's lock and loading, or building), the device opening alone measured beside it (floor), and
# the rest (prefill, steps, buffers, teardown).
set -uo pipefail
KPC=${KPC:-.gpu/kpc}
N=${N:-8}
rounds=${ROUNDS:-3}
read -ra args <<<"${ARGS:---heads 32 --kv-heads 8 --head-dim 128 --prompt 512 --steps 4}"
now() { date +%s.%N; }
sec() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
for dev in ${DEVICES:-vulkan:gpu opencl:gpu}; do
  echo "## $dev: ${args[*]}, $N processes"
  for ((r = 1; r <= rounds; r++)); do
    one=$(mktemp -d)
    t0=$(now); KPC_CACHE_DIR=$one POCL_CACHE_DIR=$one/pocl "$KPC" attention --device "$dev" "${args[@]}" >"$one/out.txt" 2>&1; t1=$(now)
    kernels=$(grep -c '^  kernel:' "$one/out.txt")
    shared=$(mktemp -d)
    pids=(); t2=$(now)
    for ((i = 1; i <= N; i++)); do
      (s0=$(now); KPC_CACHE_DIR=$shared POCL_CACHE_DIR=$shared/pocl$i "$KPC" attention --device "$dev" "${args[@]}" >"$shared.out$i" 2>&1; echo "wall $(sec "$s0" "$(now)")" >>"$shared.out$i") &
      pids+=($!)
    done
    wait "${pids[@]}"; t3=$(now)
    f1a=$(now); "$KPC" bench-start --device "$dev" --phase floor >/dev/null 2>&1; f1b=$(now)
    pids=(); f2a=$(now)
    for ((i = 1; i <= N; i++)); do "$KPC" bench-start --device "$dev" --phase floor >/dev/null 2>&1 & pids+=($!); done
    wait "${pids[@]}"; f2b=$(now)
    built=$(cat "$shared".out* | grep -c '^  kernel: .* built ')
    failed=$(grep -L '^  time:' "$shared".out* | wc -l)
    echo "round $r: one process $(sec "$t0" "$t1") s; $N on one dir $(sec "$t2" "$t3") s ($(awk -v a="$(sec "$t0" "$t1")" -v b="$(sec "$t2" "$t3")" 'BEGIN{printf "%.2f", b/a}')x); floor one $(sec "$f1a" "$f1b") s, $N at once $(sec "$f2a" "$f2b") s; builds $built for $kernels kernels; runs without a result $failed"
    # "  kernel:  NAME  SOURCE[ (note)] in MS ms": the source, and the time before " ms".
    cat "$shared".out* | awk '$1 == "kernel:" { ms = $(NF - 1); src[$3] = src[$3] " " $2 "=" ms } END { for (s in src) print "  " s ":" src[s] }'
    for ((i = 1; i <= N; i++)); do
      awk -v i="$i" '$1 == "kernel:" { acq += $(NF - 1); how = how " " $3 } $1 == "wall" { wall = $2 }
        END { printf "  process %d: wall %.3f s, kernels %.3f s (%s), other %.3f s\n", i, wall, acq / 1000, how, wall - acq / 1000 }' "$shared.out$i"
    done
    rm -rf "$one" "$shared" "$shared".out*
  done
done
