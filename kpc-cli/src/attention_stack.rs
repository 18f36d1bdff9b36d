//! `kpc attention --layer mha --layers N [--cross S]`: a decoder stack of N self-attention layers,
//! each followed by a cross-attention layer over S encoder positions with `--cross`, chained on the
//! device ([`DecoderStack`]): the prompt prefilled layer by layer on device tensors, then one
//! submission per decode step for the whole stack. Per step it reports the device time (GPU
//! timestamps from the step's first launch to its last), the wall time (from the call to the end
//! of the host's wait for the step, the input already on the device), and the floor: every byte
//! of weights and K/V the step reads at the copy bandwidth measured in the same run. `--check`
//! compares every output with the float64 reference run layer by layer over the whole sequence.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::attention_args::{Args, KvArg, Plan};
use crate::mha_random::{Rng, median, random_weights, view};
use kpc::Context;
use kpc_attention::mha::reference::{RefCall, multi_head_attention};
use kpc_attention::reference::relative_error;
use kpc_attention::{
    DecoderLayer, DecoderStack, Dtype, KvDtype, MhaKind, MhaParams, MultiHeadAttention, Tensor,
    round_to_f16,
};

/// Bytes of weights and biases a decode step reads from a layer: the projections it runs (Q, K
/// and V for self-attention, Q only for cross-attention; the output projection for both).
fn step_weight_bytes(p: &MhaParams) -> u64 {
    let w = p.weight_dtype.bytes() as u64;
    let (e, q, kv) = (p.embed_dim as u64, p.qdim as u64, p.kv_dim() as u64);
    let inputs = match p.kind {
        MhaKind::SelfAttention => e + 2 * kv,
        MhaKind::CrossAttention => e,
    };
    inputs * q * w + inputs * 4 + q * e * w + q * 4
}

/// Bytes of K and V a step reads attending `len` positions.
fn kv_bytes(p: &MhaParams, len: usize) -> u64 {
    (2 * p.batch * p.kv_dim() * len * p.cache_dtype.bytes()) as u64
}

fn rows(x: &[f32], b: usize, total: usize, w: usize, from: usize, n: usize) -> Vec<f32> {
    (0..b)
        .flat_map(|i| x[(i * total + from) * w..][..n * w].iter().copied())
        .collect()
}

pub(crate) fn run(ctx: &Context, args: &Args, plan: Plan, n: usize) -> kpc::Result<ExitCode> {
    let s = plan.shape;
    let (prompt, steps) = (args.prompt, args.steps);
    let e = s.q_heads * s.head_dim;
    let act = match args.activations {
        KvArg::F16 => Dtype::F16,
        KvArg::F32 => Dtype::F32,
    };
    let base = MhaParams {
        num_kv_heads: s.kv_heads,
        batch: s.batch,
        capacity: prompt + steps,
        weight_dtype: plan.dtype,
        cache_dtype: plan.dtype,
        projection: args.projection.kernel(),
        ..MhaParams::new(e, s.q_heads)
    };
    let cross_p = args.cross.map(|len| MhaParams {
        kind: MhaKind::CrossAttention,
        capacity: len.max(1),
        ..base
    });
    outln!(
        "kpc attention --layer mha --layers {n}: B={} E={e} Hq={} Hkv={} D={} prompt={prompt} \
         steps={steps} cross={} weights and kv={:?} activations={act:?}",
        s.batch,
        s.q_heads,
        s.kv_heads,
        s.head_dim,
        args.cross.map_or("none".into(), |c| c.to_string()),
        plan.dtype
    );
    outln!("{}", crate::attention_report::device_line(&plan.device));
    let mut rng = Rng::new();
    let mut weights = Vec::with_capacity(n);
    let mut decoder = Vec::with_capacity(n);
    for _ in 0..n {
        let sw = random_weights(&mut rng, &base);
        let cw = cross_p.map(|p| random_weights(&mut rng, &p));
        let self_attn = MultiHeadAttention::with_options(ctx, &base, &view(&sw), plan.options)?;
        let cross_attn = match (&cross_p, &cw) {
            (Some(p), Some(w)) => Some(MultiHeadAttention::with_options(
                ctx,
                p,
                &view(w),
                plan.options,
            )?),
            _ => None,
        };
        decoder.push(DecoderLayer {
            self_attn,
            cross_attn,
        });
        // The reference needs them; otherwise they go now (8 layers at E = 4096 are 2 GB).
        if args.check {
            weights.push((sw, cw));
        }
    }
    let mut stack = DecoderStack::new(ctx, decoder, act)?;
    let first = &stack.layers()[0].self_attn;
    outln!(
        "kernels: prefill projects with {}, steps with {}",
        first.prefill_projection(),
        if first.uses_matvec() {
            "mha_gemv"
        } else {
            first.prefill_projection()
        }
    );

    let b = s.batch;
    let total = prompt + steps;
    let round = |v: Vec<f32>| match act {
        Dtype::F16 => round_to_f16(&v),
        Dtype::F32 => v,
    };
    let x = round(rng.vec(b * total * e, 1.0));
    let memory = args
        .cross
        .map(|len| (len, round(rng.vec(b * len * e, 1.0))));
    if let Some((len, m)) = &memory {
        let mt = Tensor::from_f32(ctx, &[b, *len, e], act, m)?;
        stack.set_memory(&mt, None)?;
    }
    // The prompt, layer by layer on the device: each sublayer's output is the next one's input.
    let mut prompt_out = Vec::new();
    if prompt > 0 {
        let t = Instant::now();
        let mut h = Tensor::from_f32(ctx, &[b, prompt, e], act, &rows(&x, b, total, e, 0, prompt))?;
        let mut device = Duration::ZERO;
        let mut timed = true;
        for l in stack.layers_mut() {
            for m in std::iter::once(&mut l.self_attn).chain(l.cross_attn.as_mut()) {
                let mut out = Tensor::new(ctx, &[b, prompt, e], act)?;
                m.prefill_device(&h, &mut out, None)?;
                match m.last_times()? {
                    Some(t) => device += t.projection + t.attention,
                    None => timed = false,
                }
                h = out;
            }
        }
        if args.check {
            prompt_out = h.read_f32()?;
        }
        outln!(
            "prefill: {prompt} positions through {} sublayers: {:.3} ms wall{}",
            stack.layers().len() * (1 + usize::from(args.cross.is_some())),
            t.elapsed().as_secs_f64() * 1e3,
            if timed {
                format!(", {:.3} ms device", device.as_secs_f64() * 1e3)
            } else {
                String::new()
            }
        );
    }

    let xt = Tensor::new(ctx, &[b, e], act)?;
    let mut y = Tensor::new(ctx, &[b, e], act)?;
    // Untimed steps for at least 500 ms first, rolled back to the prompt whenever the cache is full
    // (the GPU leaves its idle clocks only under sustained load, and the host's set-up left it idle
    // for seconds), then the copy bandwidth of this run, just before the timed steps.
    let warm = Instant::now();
    xt.write_f32(&rows(&x, b, total, e, prompt, 1))?;
    while steps > 0 && warm.elapsed() < Duration::from_millis(500) {
        for _ in 0..steps {
            stack.step(&xt, &mut y)?;
        }
        stack.wait()?;
        stack.truncate(prompt);
    }
    let bw = crate::attention_measure::copy_bandwidth(ctx)?.0;
    let weight_bytes: u64 = base_bytes(&stack);
    outln!(
        "copy bandwidth: {:.1} GB/s (read + write; the floor reads at this rate); weights read per \
         step: {:.1} MB",
        bw / 1e9,
        weight_bytes as f64 / 1e6
    );

    let (mut wall, mut device, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    let mut subs = Vec::new();
    let mut host = Vec::new();
    // Device time per kernel over the steps, summed, and launches.
    let mut per_kernel: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
    let mut outs = Vec::new();
    for i in 0..steps {
        xt.write_f32(&rows(&x, b, total, e, prompt + i, 1))?;
        let before = ctx.stats().backend_counters.batches;
        let t = Instant::now();
        stack.step(&xt, &mut y)?;
        host.push(t.elapsed().as_secs_f64() * 1e6);
        stack.wait()?;
        let w = t.elapsed();
        for (k, d) in stack.last_launch_times()?.unwrap_or_default() {
            let e = per_kernel.entry(k).or_default();
            e.0 += d.as_secs_f64() * 1e6;
            e.1 += 1;
        }
        subs.push(ctx.stats().backend_counters.batches - before);
        wall.push(w.as_secs_f64() * 1e6);
        if let Some(d) = stack.last_device_time()? {
            device.push(d.as_secs_f64() * 1e6);
        }
        let attended = prompt + i + 1;
        let kv: u64 = stack
            .layers()
            .iter()
            .map(|l| {
                kv_bytes(l.self_attn.params(), attended)
                    + l.cross_attn
                        .as_ref()
                        .map_or(0, |c| kv_bytes(c.params(), c.len()))
            })
            .sum();
        floor.push((weight_bytes + kv) as f64 / bw * 1e6);
        if args.check {
            outs.push(y.read_f32()?);
        }
    }
    if steps > 0 {
        let (w, dv, f) = (median(&mut wall), median(&mut device), median(&mut floor));
        let h = median(&mut host);
        if !per_kernel.is_empty() {
            let each: Vec<String> = per_kernel
                .iter()
                .map(|(k, (t, c))| format!("{k} {:.1} us x {}", t / steps as f64, c / steps))
                .collect();
            outln!(
                "launches per step (mean device time, count): {}",
                each.join(", ")
            );
        }
        let most = subs.iter().max().copied().unwrap_or(0);
        outln!(
            "step: {w:.1} us wall, {dv:.1} us device, floor {f:.1} us (device {:.2}x the floor); \
             wall - device {:.1} us, of which {h:.1} us recording and submitting; {most} \
             submission(s) per step (median of {steps} steps)",
            dv / f,
            w - dv
        );
        outln!(
            "bench: phase=mha_stack layers={n} cross={} L={} steps={steps} wall_us={w:.2} \
             device_us={dv:.2} floor_us={f:.2} host_us={h:.2} copy_gbs={:.1} submissions={most}",
            args.cross.unwrap_or(0),
            prompt + steps / 2,
            bw / 1e9
        );
    }

    if !args.check {
        return Ok(ExitCode::SUCCESS);
    }
    let sublayers = n * (1 + usize::from(args.cross.is_some()));
    let per = match plan.dtype {
        KvDtype::F32 => 1e-4,
        KvDtype::F16 => 2e-3,
    } + match act {
        Dtype::F32 => 0.0,
        Dtype::F16 => 1e-3,
    };
    let tolerance = per * sublayers as f64;
    let mut h = x.clone();
    for (sw, cw) in &weights {
        let call = RefCall {
            q_in: &h,
            k_in: &h,
            v_in: &h,
            q_len: total,
            kv_len: total,
            mask: None,
            causal: true,
        };
        h = to_f32(&multi_head_attention(&base, &view(sw), &call)?);
        if let (Some(p), Some(w), Some((len, m))) = (&cross_p, cw, &memory) {
            let call = RefCall {
                q_in: &h,
                k_in: m,
                v_in: m,
                q_len: total,
                kv_len: *len,
                mask: None,
                causal: false,
            };
            h = to_f32(&multi_head_attention(p, &view(w), &call)?);
        }
    }
    let want: Vec<f64> = h.iter().map(|&v| f64::from(v)).collect();
    let mut got = vec![0f32; b * total * e];
    for i in 0..b {
        if prompt > 0 {
            got[i * total * e..][..prompt * e]
                .copy_from_slice(&prompt_out[i * prompt * e..][..prompt * e]);
        }
        for (t, y) in outs.iter().enumerate() {
            got[(i * total + prompt + t) * e..][..e].copy_from_slice(&y[i * e..][..e]);
        }
    }
    let worst = relative_error(&got, &want);
    let ok = worst <= tolerance;
    outln!(
        "check:   |out - ref| / |ref| = {worst:.3e} over {sublayers} sublayers (tolerance \
         {tolerance:.1e}): {}",
        if ok { "ok" } else { "FAILED" }
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// Weight bytes a step of the whole stack reads.
fn base_bytes(stack: &DecoderStack) -> u64 {
    stack
        .layers()
        .iter()
        .map(|l| {
            step_weight_bytes(l.self_attn.params())
                + l.cross_attn
                    .as_ref()
                    .map_or(0, |c| step_weight_bytes(c.params()))
        })
        .sum()
}
