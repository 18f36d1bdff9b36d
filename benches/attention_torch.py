#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on the shapes kpc's attention benchmark uses, for a side by side
comparison on the GPU host (which has PyTorch but no Rust toolchain).

Times every SDPA backend that accepts the shape (flash, efficient, cudnn, math) with CUDA events after
warm-up, median of many runs, rotating among several input sets so repeated runs do not measure a warm
L2. Prints one table for decode (one query against an L-long fp16 KV cache) and one for causal prefill.
Decode is timed two ways: one SDPA call (median), and whole steps as kpc times them: 50 steps back to
back, each appending its K/V row into a preallocated cache and attending over the cache so far, with
events around all 50. Both are printed again replayed from a CUDA graph (`graph` columns): the host's
launch cost (50-100 µs a call on some hosts, more than a decode kernel) then leaves no gaps, so those
columns are the kernels' own time, the figure to compare with kpc's device time.

    python3 benches/attention_torch.py [--batch 1] [--heads 32] [--kv-heads 32] [--head-dim 128]
"""

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [
    ("flash", SDPBackend.FLASH_ATTENTION),
    ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ("math", SDPBackend.MATH),
]


def time_ms(fn, sets, warmup=5, reps=50):
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        args = sets[i % len(sets)]
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_us(calls_fn, calls=20, reps=10):
    """Microseconds per call of `calls_fn(i)` (one call, i = 0..calls-1) captured `calls` times in one
    CUDA graph and replayed: the kernels' time without the host's launch gaps. None where capture
    fails."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture, as CUDA graphs require
            for i in range(3):
                calls_fn(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                calls_fn(i)
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        del g
        return statistics.median(times) * 1e3 / calls
    except RuntimeError:
        torch.cuda.synchronize()
        return None


def sdpa(backend, causal, gqa):
    def run(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return run


def step_us(backend, B, H, Hkv, L, D, gqa, steps=50, dev="cuda", graph=False):
    """Whole decode steps (append + attention) back to back, microseconds per step; with `graph`, the
    50 steps captured in a CUDA graph and replayed."""
    cap = L + 2 * steps
    kc = torch.randn(B, Hkv, cap, D, dtype=torch.float16, device=dev)
    vc = torch.randn(B, Hkv, cap, D, dtype=torch.float16, device=dev)
    q = torch.randn(B, H, 1, D, dtype=torch.float16, device=dev)
    kn = torch.randn(B, Hkv, steps, D, dtype=torch.float16, device=dev)
    vn = torch.randn(B, Hkv, steps, D, dtype=torch.float16, device=dev)

    def run(first):
        for i in range(steps):
            pos = first + i
            kc[:, :, pos].copy_(kn[:, :, i])
            vc[:, :, pos].copy_(vn[:, :, i])
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(
                    q, kc[:, :, : pos + 1], vc[:, :, : pos + 1], enable_gqa=gqa
                )

    try:
        if graph:
            # One "call" is the whole 50 steps at positions L.., replayed as captured.
            t = graph_us(lambda i: run(L), calls=1, reps=5)
            return None if t is None else t / steps
        run(L)  # warm-up
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run(L)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1e3 / steps
    except RuntimeError:
        return None
    finally:
        del kc, vc


def decode_sets(B, H, Hkv, L, D, dev):
    """Four decode input sets (one query per head, an L-long K/V), rotated so L2 stays cold."""
    return [
        (
            torch.randn(B, H, 1, D, dtype=torch.float16, device=dev),
            torch.randn(B, Hkv, L, D, dtype=torch.float16, device=dev),
            torch.randn(B, Hkv, L, D, dtype=torch.float16, device=dev),
        )
        for _ in range(4)
    ]


def sets_graph(B, H, Hkv, L, D, gqa, dev):
    """Per backend: one SDPA call and one whole step, from CUDA graphs (µs)."""
    sets = decode_sets(B, H, Hkv, L, D, dev)
    calls, steps = {}, {}
    for name, backend in BACKENDS:
        if name == "math":  # never the fastest at decode, and slow to replay thousands of times
            calls[name] = steps[name] = None
            continue
        fn = sdpa(backend, False, gqa)
        calls[name] = graph_us(lambda i, fn=fn: fn(*sets[i % len(sets)]))
        steps[name] = step_us(backend, B, H, Hkv, L, D, gqa, graph=True)
    del sets
    return calls, steps


def best(fns, sets):
    out = {}
    for name, backend in BACKENDS:
        try:
            out[name] = time_ms(fns(backend), sets)
        except RuntimeError as e:  # the backend does not support this shape
            out[name] = None
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--decode", default="1024,4096,16384,32768")
    p.add_argument("--prefill", default="512,1024,2048,4096,8192")
    a = p.parse_args()
    B, H, D = a.batch, a.heads, a.head_dim
    Hkv = a.kv_heads or H
    gqa = Hkv != H
    dev = "cuda"
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"shape: B={B} H={H} Hkv={Hkv} D={D}, fp16 q/k/v")

    # Copy bandwidth of the device, for the same ratio kpc reports.
    n = 1 << 28
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = time_ms(lambda s, d: d.copy_(s), [(src, dst)])
    copy_gbs = 2 * n / ms / 1e6
    print(f"device copy bandwidth (256 MiB d2d, read+write): {copy_gbs:.0f} GB/s")

    names = [n for n, _ in BACKENDS]
    print("\ndecode: one query per head against an L-long KV cache")
    print(
        f"{'L':>6} | "
        + " | ".join(f"{n:>10} us" for n in names)
        + " | best GB/s | of copy | "
        + " | ".join(f"{n + ' step':>13}" for n in names)
        + " | best step us"
    )
    graphs = []
    for L in [int(x) for x in a.decode.split(",") if x]:
        sets = decode_sets(B, H, Hkv, L, D, dev)
        r = best(lambda bk: sdpa(bk, False, gqa), sets)
        ok = [t for t in r.values() if t is not None]
        bytes_ = 2 * B * Hkv * L * D * 2
        gbs = bytes_ / min(ok) / 1e6 if ok else 0
        cells = " | ".join(f"{r[n] * 1e3:>13.1f}" if r[n] else f"{'-':>13}" for n in names)
        del sets
        st = {n: step_us(bk, B, H, Hkv, L, D, gqa) for n, bk in BACKENDS}
        ok_st = [t for t in st.values() if t is not None]
        st_cells = " | ".join(f"{st[n]:>13.1f}" if st[n] else f"{'-':>13}" for n in names)
        best_st = f"{min(ok_st):>12.1f}" if ok_st else f"{'-':>12}"
        print(f"{L:>6} | {cells} | {gbs:>8.0f} | {gbs / copy_gbs:>6.0%} | {st_cells} | {best_st}")
        graphs.append((L, sets_graph(B, H, Hkv, L, D, gqa, dev), st))

    print("\ndecode from a CUDA graph (no launch gaps; the kernels' own time): us per call / per step")
    print(
        f"{'L':>6} | "
        + " | ".join(f"{n + ' graph':>13}" for n in names)
        + " | "
        + " | ".join(f"{n + ' g.step':>13}" for n in names)
        + " | best us | best step"
    )
    for L, (gs, gst), _ in graphs:
        cells = " | ".join(f"{gs[n]:>13.1f}" if gs[n] else f"{'-':>13}" for n in names)
        st_cells = " | ".join(f"{gst[n]:>13.1f}" if gst[n] else f"{'-':>13}" for n in names)
        ok = [t for t in gs.values() if t is not None]
        ok_st = [t for t in gst.values() if t is not None]
        b1 = f"{min(ok):>7.1f}" if ok else f"{'-':>7}"
        b2 = f"{min(ok_st):>9.1f}" if ok_st else f"{'-':>9}"
        print(f"{L:>6} | {cells} | {st_cells} | {b1} | {b2}")

    print("\ncausal prefill: TFLOP/s counted as 2*B*H*L^2*D (the causal half)")
    print(f"{'L':>6} | " + " | ".join(f"{n:>10} ms" for n in names) + " | best TFLOP/s")
    for L in [int(x) for x in a.prefill.split(",") if x]:
        sets = []
        for _ in range(2):
            q = torch.randn(B, H, L, D, dtype=torch.float16, device=dev)
            k = torch.randn(B, Hkv, L, D, dtype=torch.float16, device=dev)
            v = torch.randn(B, Hkv, L, D, dtype=torch.float16, device=dev)
            sets.append((q, k, v))
        r = best(lambda bk: sdpa(bk, True, gqa), sets)
        ok = [t for t in r.values() if t is not None]
        flops = 2 * B * H * L * L * D
        tf = flops / min(ok) / 1e9 if ok else 0
        cells = " | ".join(f"{r[n]:>13.3f}" if r[n] else f"{'-':>13}" for n in names)
        print(f"{L:>6} | {cells} | {tf:>12.1f}")
        del sets


if __name__ == "__main__":
    main()
