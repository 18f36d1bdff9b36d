#!/usr/bin/env python3
"""The tables of benches/gemm_gpu.sh, from the logs of one call: the ceiling (`kpc bench-mma`'s
peak and copy lines), the GEMM sweep with each case's fraction of the register-fed peak and of
cuBLAS (`F.linear` from benches/gemm_torch.py) at the same shape, the best tile per shape, and the
MHA layer's prefill before/after beside PyTorch where its logs are there.

    python3 benches/gemm_table.py OUT_DIR
"""

import re
import sys
from pathlib import Path


def kv(line):
    return dict(re.findall(r"(\w+)=(\S+)", line))


def main():
    out = Path(sys.argv[1])
    mma = (out / "bench-mma.txt").read_text().splitlines() if (out / "bench-mma.txt").exists() else []
    torch = (out / "gemm-torch.txt").read_text().splitlines() if (out / "gemm-torch.txt").exists() else []
    for line in mma:
        if line.startswith("device:"):
            print(line)
    print("\n## Ceiling\n")
    print("| what | operands | acc | fragments / tile | TFLOP/s | registers |")
    print("|---|---|---|---|---|---|")
    for line in mma:
        if line.startswith("bench: kind=mma") and "tflops=" in line:
            d = kv(line)
            print(f"| {d.get('api')} | {d.get('operands')} | {d.get('acc')} | {d.get('frags', d.get('tile'))} | {d['tflops']} | {d.get('regs', '-')} |")
        if line.startswith("bench: kind=copy"):
            d = kv(line)
            print(f"\ncopy: {d['gbs']} GB/s (read + write, 256 MiB)")
    cublas = {}
    for line in torch:
        if line.startswith("torch: kind=linear"):
            d = kv(line)
            cublas[(d["m"], d["n"], d["k"])] = float(d["tflops"])
    print("\n## GEMM sweep (TFLOP/s; of_peak: of the register-fed peak with the same accumulator)\n")
    print("| M | N | K | kernel | tiles | A | acc | TFLOP/s | of peak | of cuBLAS | err vs f64 | regs | local bytes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    best = {}
    regs = {}
    for line in mma:
        if line.startswith("bench: kind=gemm-kernel") and "refused" not in line:
            d = kv(line)
            regs[(d["kernel"], d["tiles"], d["a"], d["acc"])] = (d.get("regs", "-"), d.get("local_bytes", "-"))
    for line in mma:
        if not line.startswith("bench: kind=gemm "):
            continue
        d = kv(line)
        shape = (d["m"], d["n"], d["k"])
        tf = float(d["tflops"])
        cb = cublas.get(shape)
        r, lb = regs.get((d["kernel"], d["tiles"], d["a"], d["acc"]), ("-", "-"))
        ok = "" if line.rstrip().endswith(" ok") else " FAIL"
        ofcb = f"{tf / cb:.2f}" if cb else "-"
        print(
            f"| {d['m']} | {d['n']} | {d['k']} | {d['kernel']} | {d['tiles']} | {d['a']} | {d['acc']} |"
            f" {tf:.1f} | {d.get('of_peak', '-')} | {ofcb} | {d['err']}{ok} | {r} | {lb} |"
        )
        key = (shape, d["a"], d["acc"])
        if d["kernel"] == "mha_gemm_wide" and (key not in best or tf > best[key][0]):
            best[key] = (tf, d["tiles"], d.get("of_peak", "-"), cb)
    print("\n## Best tile per shape\n")
    print("| M | N | K | A | acc | tiles | TFLOP/s | of peak | cuBLAS TFLOP/s | of cuBLAS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (shape, a, acc), (tf, tiles, op, cb) in sorted(best.items()):
        ofcb = f"{tf / cb:.2f}" if cb else "-"
        print(f"| {' | '.join(shape)} | {a} | {acc} | {tiles} | {tf:.1f} | {op} | {cb or '-'} | {ofcb} |")
    layer = out / "mha-layer.txt"
    if layer.exists():
        print("\n## MHA layer prefill (B=1, E=4096, H=32, D=128, fp16 weights and K/V; kpc: device time, median of 5)\n")
        print("| Hkv | L | projection | total ms | proj ms | attn ms | TFLOP/s |")
        print("|---|---|---|---|---|---|---|")
        tag = None
        for line in layer.read_text().splitlines():
            if line.startswith("# "):
                tag = kv(line)
            elif line.startswith("bench: phase=mha_prefill") and tag:
                d = kv(line)
                print(f"| {tag['Hkv']} | {d['L']} | {tag['projection']} | {d['device_ms']} | {d['proj_ms']} | {d['attn_ms']} | {d['tflops']} |")
    mt = out / "mha-torch.txt"
    if mt.exists():
        print("\nPyTorch (same call):")
        for line in mt.read_text().splitlines():
            if line.startswith("torch: phase=prefill"):
                print("  " + line)


if __name__ == "__main__":
    main()
