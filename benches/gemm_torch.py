#!/usr/bin/env python3
"""PyTorch's `F.linear` (cuBLAS) at the projection GEMM's shapes, for benches/gemm_gpu.sh: Y = X W^T + b
with X [M][K], W [N][K], b [N], all fp16 (cuBLAS sums in fp32), the work of one `mha_gemm_wide` launch.
Timed by CUDA-graph replay of 20 back-to-back calls, after at least 300 ms of untimed replays (the
GPU leaves its idle clocks only under load); the median of 5 rounds. Inputs are random normal, W at
a layer's scale (K^-1/2).

Output: `torch: kind=linear m= n= k= us= tflops=` lines, then the fp16 and fp32 error of F.linear
against float64 at the same shapes' first rows (relative 2-norm), as the kpc bench reports its own.

    python3 benches/gemm_torch.py [--shapes 2048x4096x4096,8192x4096x4096,...]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def graph_us(fn, reps=20, rounds=5, warm_s=0.3):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    while time.perf_counter() - t < warm_s:
        g.replay()
        torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    del g
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument(
        "--shapes", default="2048x4096x4096,8192x4096x4096,2048x1024x4096,8192x1024x4096"
    )
    a = p.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    print(f'torch: device="{torch.cuda.get_device_name()}" torch={torch.__version__} cuda={torch.version.cuda}')
    for text in a.shapes.split(","):
        m, n, k = (int(v) for v in text.split("x"))
        x = torch.randn(m, k, device=dev, dtype=torch.float16)
        w = (torch.randn(n, k, device=dev) * k**-0.5).half()
        b = (torch.randn(n, device=dev) * 0.1).half()

        us = graph_us(lambda: F.linear(x, w, b))
        tf = 2 * m * n * k / us / 1e6
        # Accuracy of the fp16 result against float64, on the first 64 rows.
        ref = (x[:64].double() @ w.double().t()) + b.double()
        got = F.linear(x[:64], w, b).double()
        err = ((got - ref).norm() / ref.norm()).item()
        print(f"torch: kind=linear m={m} n={n} k={k} us={us:.1f} tflops={tf:.1f} err_fp16_out={err:.2e}")
        del x, w, b
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
