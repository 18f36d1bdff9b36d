#!/usr/bin/env python3
"""PyTorch doing the work of one decode step (and one prefill) of kpc's MultiHeadAttention layer, for
the side-by-side table of issue 27 on the GPU host (which has PyTorch but no Rust toolchain).

Per decode step, fp16 weights and K/V, B=1: Q, K and V projected by F.linear (three calls, and also
one fused call over the concatenated weights), the new K/V row written into a preallocated cache of
capacity L at position L-1, SDPA of the one query over the cache's L positions, the output projection.
Every linear has its bias, as kpc's layer does. Timed by CUDA-graph replay: the step is captured once,
replayed for at least 300 ms untimed (the GPU leaves its idle clocks only under load), then 5 rounds
of 100 back-to-back replays between CUDA events; the median round over 100 is the step.

SDPA backend: cuDNN where it takes the shape inside a graph, else the fastest that does; every
backend's figure is printed too. The headline step uses the faster of three and one fused Q/K/V
linear (both are F.linear).

The weights-read floor: every projection weight and bias plus the K/V a step reads
(2 * Hkv * L * D * 2 bytes), at the copy bandwidth of a 256 MiB device-to-device `copy_` measured in
the same call (bytes read plus written over its time, median of 50 after warm-up).

Prefill at length L (same weights): the Q/K/V projections of L rows, the K/V written into the cache,
causal SDPA over it, the output projection, also by graph replay. FLOPs counted as kpc's CLI counts
them: 2*L*E*(E + 2*Hkv*D) + 2*L*E*E for the projections plus 2*H*L^2*D for causal attention (half of
the 4*H*L^2*D of the full score and value products).

Output: `torch: ...` lines of key=value pairs (machine-readable; benches/mha_gpu.sh reads them), then a
table for people.

    python3 benches/mha_torch.py [--embed 4096] [--heads 32] [--kv-heads 32,8]
        [--decode 1024,4096,16384] [--prefill 2048,8192]
"""

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [
    ("cudnn", SDPBackend.CUDNN_ATTENTION),
    ("flash", SDPBackend.FLASH_ATTENTION),
    ("efficient", SDPBackend.EFFICIENT_ATTENTION),
]


def graph_us(fn, reps=100, rounds=5, warm_s=0.3):
    """Microseconds per call of `fn` by CUDA-graph replay; None where capture or replay fails."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        while time.perf_counter() - t < warm_s:
            for _ in range(10):
                g.replay()
            torch.cuda.synchronize()
        times = []
        for _ in range(rounds):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / reps)
        del g
        return statistics.median(times)
    except RuntimeError as e:
        torch.cuda.synchronize()
        print(f"  (not timed: {str(e).splitlines()[0][:160]})")
        return None


class Layer:
    """One layer's fp16 weights and a preallocated K/V cache."""

    def __init__(self, E, H, Hkv, cap, dev):
        self.E, self.H, self.Hkv, self.D = E, H, Hkv, E // H
        self.kv = Hkv * self.D
        s = E**-0.5

        def w(rows):
            return (torch.randn(rows, E, device=dev) * s).half()

        def b(rows):
            return (torch.randn(rows, device=dev) * 0.1).half()

        self.wq, self.wk, self.wv, self.wo = w(E), w(self.kv), w(self.kv), w(E)
        self.bq, self.bk, self.bv, self.bo = b(E), b(self.kv), b(self.kv), b(E)
        self.wqkv = torch.cat([self.wq, self.wk, self.wv]).contiguous()
        self.bqkv = torch.cat([self.bq, self.bk, self.bv]).contiguous()
        self.kc = torch.randn(1, Hkv, cap, self.D, device=dev, dtype=torch.float16)
        self.vc = torch.randn(1, Hkv, cap, self.D, device=dev, dtype=torch.float16)

    def weight_bytes(self):
        return sum(
            t.numel() * t.element_size()
            for t in (self.wq, self.wk, self.wv, self.wo, self.bq, self.bk, self.bv, self.bo)
        )

    def qkv(self, x, fused):
        if fused:
            return F.linear(x, self.wqkv, self.bqkv).split([self.E, self.kv, self.kv], -1)
        return F.linear(x, self.wq, self.bq), F.linear(x, self.wk, self.bk), F.linear(x, self.wv, self.bv)

    def forward(self, x, start, n, backend, fused, causal):
        """x [1, n, E] at positions [start, start + n): project, write K/V, attend [0, start + n)."""
        q, k, v = self.qkv(x, fused)
        q = q.view(1, n, self.H, self.D).transpose(1, 2)
        self.kc[:, :, start : start + n].copy_(k.view(1, n, self.Hkv, self.D).transpose(1, 2))
        self.vc[:, :, start : start + n].copy_(v.view(1, n, self.Hkv, self.D).transpose(1, 2))
        end = start + n
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(
                q,
                self.kc[:, :, :end],
                self.vc[:, :, :end],
                is_causal=causal,
                enable_gqa=self.Hkv != self.H,
            )
        return F.linear(o.transpose(1, 2).reshape(1, n, self.E), self.wo, self.bo)


def fmt(v, spec=".2f"):
    return "nan" if v is None else format(v, spec)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--embed", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", default="32,8")
    p.add_argument("--decode", default="1024,4096,16384")
    p.add_argument("--prefill", default="2048,8192")
    p.add_argument(
        "--stack",
        type=int,
        default=1,
        help="also time a decode step through this many layers captured in one graph (cuDNN SDPA, "
        "fused Q/K/V): kpc's --layers N",
    )
    a = p.parse_args()
    E, H = a.embed, a.heads
    dev = "cuda"
    torch.manual_seed(0)
    # Backends that refuse a shape warn at every try; the refusal itself is reported.
    warnings.filterwarnings("ignore")
    print(
        f"torch: device=\"{torch.cuda.get_device_name()}\" torch={torch.__version__} "
        f"cudnn={torch.backends.cudnn.version()} E={E} H={H} D={E // H} B=1 dtype=fp16"
    )

    n = 1 << 28
    src = torch.randn(n // 2, device=dev, dtype=torch.float16)
    dst = torch.empty_like(src)
    for _ in range(10):
        dst.copy_(src)
    ts = []
    for _ in range(50):
        x, y = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        x.record()
        dst.copy_(src)
        y.record()
        y.synchronize()
        ts.append(x.elapsed_time(y))
    copy_gbs = 2 * n / statistics.median(ts) / 1e6
    del src, dst
    print(f"torch: phase=copy bytes_each_way={n} gbs={copy_gbs:.1f}")

    decode = [int(x) for x in a.decode.split(",") if x]
    prefill = [int(x) for x in a.prefill.split(",") if x]
    rows = []
    for hkv in [int(x) for x in a.kv_heads.split(",") if x]:
        cap = max(decode + prefill)
        layer = Layer(E, H, hkv, cap, dev)
        stack = [layer] + [Layer(E, H, hkv, max(decode), dev) for _ in range(a.stack - 1)] if a.stack > 1 and decode else []
        for L in decode:
            if stack:
                xs = torch.randn(1, 1, E, device=dev, dtype=torch.float16)
                outs = torch.empty(1, 1, E, device=dev, dtype=torch.float16)

                def stack_step():
                    h = xs
                    for l in stack:
                        h = l.forward(h, L - 1, 1, SDPBackend.CUDNN_ATTENTION, True, False)
                    outs.copy_(h)

                st = graph_us(stack_step)
                sfloor = sum(l.weight_bytes() + 2 * hkv * L * l.D * 2 for l in stack)
                print(
                    f"torch: phase=stack layers={len(stack)} Hkv={hkv} L={L} step_us={fmt(st)} "
                    f"floor_us={sfloor / copy_gbs / 1e3:.2f}",
                    flush=True,
                )
            x = torch.randn(1, 1, E, device=dev, dtype=torch.float16)
            out = torch.empty(1, 1, E, device=dev, dtype=torch.float16)
            r = {}
            for name, bk in BACKENDS:
                for fused in (False, True):
                    def step(bk=bk, fused=fused):
                        out.copy_(layer.forward(x, L - 1, 1, bk, fused, False))

                    r[(name, fused)] = graph_us(step)
            # The step's parts, for the split kpc prints: the four projections alone, and the K/V
            # write plus attention alone.
            def proj(fused):
                def run():
                    q, k, v = layer.qkv(x, fused)
                    out.copy_(F.linear(q, layer.wo, layer.bo))
                    return k, v
                return run

            proj_us = {f: graph_us(proj(f)) for f in (False, True)}
            q1 = torch.randn(1, H, 1, layer.D, device=dev, dtype=torch.float16)
            k1 = torch.randn(1, hkv, 1, layer.D, device=dev, dtype=torch.float16)
            attn_us = {}
            for name, bk in BACKENDS:
                def attn(bk=bk):
                    layer.kc[:, :, L - 1 : L].copy_(k1)
                    layer.vc[:, :, L - 1 : L].copy_(k1)
                    with sdpa_kernel([bk]):
                        o = F.scaled_dot_product_attention(
                            q1, layer.kc[:, :, :L], layer.vc[:, :, :L], enable_gqa=hkv != H
                        )
                    out.view(1, H, 1, layer.D).copy_(o)

                attn_us[name] = graph_us(attn)
            ok = {k: v for k, v in r.items() if v is not None}
            if r.get(("cudnn", False)) is not None or r.get(("cudnn", True)) is not None:
                sdpa = "cudnn"
            else:
                sdpa = min(ok, key=ok.get)[0] if ok else "none"
            pick = [v for (nm, _), v in ok.items() if nm == sdpa]
            step_us = min(pick) if pick else None
            best_key = min(ok, key=ok.get) if ok else None
            floor_bytes = layer.weight_bytes() + 2 * hkv * L * layer.D * 2
            floor_us = floor_bytes / copy_gbs / 1e3
            line = (
                f"torch: phase=decode Hkv={hkv} L={L} sdpa={sdpa} step_us={fmt(step_us)} "
                f"best_us={fmt(ok.get(best_key))} best={best_key[0] if best_key else 'none'}"
                f"{'+fused' if best_key and best_key[1] else ''} "
                f"proj_us={fmt(min(v for v in proj_us.values() if v is not None) if any(proj_us.values()) else None)} "
                f"attn_us={fmt(attn_us.get(sdpa))} floor_us={floor_us:.2f} floor_bytes={floor_bytes} "
                + " ".join(
                    f"{nm}{'_fused' if fu else ''}_us={fmt(v)}" for (nm, fu), v in r.items()
                )
                + " "
                + " ".join(f"attn_{nm}_us={fmt(v)}" for nm, v in attn_us.items())
                + f" proj_separate_us={fmt(proj_us[False])} proj_fused_us={fmt(proj_us[True])}"
            )
            print(line, flush=True)
            rows.append(("decode", hkv, L, step_us, sdpa, floor_us, ok.get(best_key), best_key))
        for L in prefill:
            x = torch.randn(1, L, E, device=dev, dtype=torch.float16)
            out = torch.empty(1, L, E, device=dev, dtype=torch.float16)
            r = {}
            for name, bk in BACKENDS:
                for fused in (False, True):
                    def pre(bk=bk, fused=fused):
                        out.copy_(layer.forward(x, 0, L, bk, fused, True))

                    t = graph_us(pre, reps=10)
                    r[(name, fused)] = None if t is None else t / 1e3
            ok = {k: v for k, v in r.items() if v is not None}
            if any(k[0] == "cudnn" for k in ok):
                sdpa = "cudnn"
            else:
                sdpa = min(ok, key=ok.get)[0] if ok else "none"
            pick = [v for (nm, _), v in ok.items() if nm == sdpa]
            ms = min(pick) if pick else None
            kv = hkv * layer.D
            flops = 2 * L * E * (E + 2 * kv) + 2 * L * E * E + 2 * H * L * L * layer.D
            tf = None if ms is None else flops / ms / 1e9
            best_key = min(ok, key=ok.get) if ok else None
            best_tf = None if best_key is None else flops / ok[best_key] / 1e9
            print(
                f"torch: phase=prefill Hkv={hkv} L={L} sdpa={sdpa} ms={fmt(ms, '.4f')} "
                f"tflops={fmt(tf, '.1f')} best={best_key[0] if best_key else 'none'}"
                f"{'+fused' if best_key and best_key[1] else ''} best_tflops={fmt(best_tf, '.1f')} "
                f"flops={flops} "
                + " ".join(f"{nm}{'_fused' if fu else ''}_ms={fmt(v, '.4f')}" for (nm, fu), v in r.items()),
                flush=True,
            )
            rows.append(("prefill", hkv, L, ms, sdpa, tf, best_tf, best_key))
        del layer
        torch.cuda.empty_cache()

    print(f"\nPyTorch, fp16, E={E} H={H} B=1, copy {copy_gbs:.0f} GB/s (read+write)")
    print("phase   | Hkv |     L | step (SDPA)             | floor / TFLOP/s | best")
    for kind, hkv, L, t, sdpa, f, best, bk in rows:
        bname = (bk[0] + ("+fused" if bk[1] else "")) if bk else "none"
        if kind == "decode":
            print(f"decode  | {hkv:>3} | {L:>5} | {fmt(t):>9} us ({sdpa:<9}) | {f:>9.2f} us    | {fmt(best)} us ({bname})")
        else:
            print(f"prefill | {hkv:>3} | {L:>5} | {fmt(t, '.3f'):>9} ms ({sdpa:<9}) | {fmt(f, '.1f'):>9} TFLOP/s | {fmt(best, '.1f')} TFLOP/s ({bname})")


if __name__ == "__main__":
    main()
