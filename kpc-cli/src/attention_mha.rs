//! `kpc attention --layer mha [--cross S]`: a decoder block's MultiHeadAttention layers (ncnn's layer
//! on kpc's attention) with a prompt's prefill and decode steps: self-attention with the KV cache,
//! plus cross-attention over S encoder positions projected once. Prints where each kernel came from,
//! the prefill's time, the time per step split into projections and attention, and with `--check`
//! the error against the float64 reference of the whole layer.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::attention_args::{Args, Plan};
use crate::mha_random::{Rng, median, random_weights, view};
use kpc::{Config, Context};
use kpc_attention::mha::MhaTimes;
use kpc_attention::mha::reference::{RefCall, multi_head_attention};
use kpc_attention::reference::relative_error;
use kpc_attention::{KvDtype, MhaKind, MhaParams, MultiHeadAttention};

/// Per-step figures of one layer: wall time and, where the backend times launches, device time
/// by phase.
#[derive(Default)]
struct StepTimes {
    wall: Vec<f64>,
    proj: Vec<f64>,
    attn: Vec<f64>,
}

impl StepTimes {
    fn push(&mut self, wall: Duration, t: Option<MhaTimes>) {
        self.wall.push(wall.as_secs_f64() * 1e6);
        if let Some(t) = t {
            self.proj.push(t.projection.as_secs_f64() * 1e6);
            self.attn.push(t.attention.as_secs_f64() * 1e6);
        }
    }

    fn report(&mut self, name: &str, len: usize) {
        let (w, p, a) = (
            median(&mut self.wall),
            median(&mut self.proj),
            median(&mut self.attn),
        );
        outln!(
            "{name}: {w:.1} us/step wall; device {:.1} us: projections {p:.1} us, attention {a:.1} \
             us (median of {} steps)",
            p + a,
            self.wall.len()
        );
        outln!(
            "bench: phase=mha_{name} L={len} wall_us={w:.2} device_us={:.2} proj_us={p:.2} \
             attn_us={a:.2}",
            p + a
        );
    }
}

/// Runs the MHA layers `args` and `plan` select on a new context.
pub fn run(config: &Config, args: &Args, plan: Plan) -> kpc::Result<ExitCode> {
    let ctx = Context::builder()
        .device(&plan.device)
        .config(config.clone())
        .build()?;
    crate::attention_report::seal_before_first_acquisition(&ctx);
    let r = run_on(&ctx, args, plan);
    crate::attention_report::seal_summary(&ctx);
    r
}

fn run_on(ctx: &Context, args: &Args, plan: Plan) -> kpc::Result<ExitCode> {
    if let Some(n) = args.layers {
        return crate::attention_stack::run(ctx, args, plan, n as usize);
    }
    let ctx = ctx.clone();
    let s = plan.shape;
    let (prompt, steps) = (args.prompt, args.steps);
    let e = s.q_heads * s.head_dim;
    let base = MhaParams {
        num_kv_heads: s.kv_heads,
        batch: s.batch,
        capacity: prompt + steps,
        weight_dtype: plan.dtype,
        cache_dtype: plan.dtype,
        projection: args.projection.kernel(),
        ..MhaParams::new(e, s.q_heads)
    };
    outln!(
        "kpc attention --layer mha: B={} E={e} Hq={} Hkv={} D={} prompt={prompt} steps={steps} \
         cross={} weights and kv={:?}",
        s.batch,
        s.q_heads,
        s.kv_heads,
        s.head_dim,
        args.cross.map_or("none".into(), |c| c.to_string()),
        plan.dtype
    );
    outln!("{}", crate::attention_report::device_line(&plan.device));
    let mut rng = Rng::new();
    let self_w = random_weights(&mut rng, &base);
    // The attention flags (--decode-kernel, --decode-split-min, ...) apply to the layers' SDPA.
    let mut layer = MultiHeadAttention::with_options(&ctx, &base, &view(&self_w), plan.options)?;
    let cross_p = args.cross.map(|len| MhaParams {
        kind: MhaKind::CrossAttention,
        capacity: len.max(1),
        ..base
    });
    let cross_w = cross_p.map(|p| random_weights(&mut rng, &p));
    let mut cross = match (&cross_p, &cross_w) {
        (Some(p), Some(w)) => Some(MultiHeadAttention::with_options(
            &ctx,
            p,
            &view(w),
            plan.options,
        )?),
        _ => None,
    };
    outln!(
        "kernels (prefill projects with {}, steps with {}):",
        layer.prefill_projection(),
        if layer.uses_matvec() {
            "mha_gemv"
        } else {
            layer.prefill_projection()
        }
    );
    let mut seen = std::collections::HashSet::new();
    for k in layer
        .kernels()
        .into_iter()
        .chain(cross.iter().flat_map(|c| c.kernels()))
    {
        if seen.insert(k.name().to_string()) {
            outln!(
                "  {:<18} {:<8} {:>10.3} ms",
                k.name(),
                k.source().to_string(),
                k.acquire_time().as_secs_f64() * 1e3
            );
        }
    }

    let b = s.batch;
    let total = prompt + steps;
    let x = rng.vec(b * total * e, 1.0);
    // Rows [from, from + n) of each sequence of `[b][total][e]`.
    let rows = |x: &[f32], from: usize, n: usize| -> Vec<f32> {
        (0..b)
            .flat_map(|i| x[(i * total + from) * e..][..n * e].iter().copied())
            .collect()
    };
    let prompt_x = rows(&x, 0, prompt);
    let t = Instant::now();
    let mut prompt_out = layer.prefill(&prompt_x, prompt, None)?;
    let mut runs = vec![(t.elapsed(), layer.last_times()?)];
    if args.prefill_runs > 1 {
        // As `kpc attention --prefill-runs`: the first run may include a driver's compile at first
        // dispatch, and the GPU leaves its idle clocks only under sustained load, so untimed runs
        // for at least 300 ms come first. Each run empties the cache and prefills the same prompt.
        let warm = Instant::now();
        while warm.elapsed() < Duration::from_millis(300) {
            layer.clear();
            layer.prefill(&prompt_x, prompt, None)?;
        }
        runs.clear();
        for _ in 0..args.prefill_runs {
            layer.clear();
            let t = Instant::now();
            prompt_out = layer.prefill(&prompt_x, prompt, None)?;
            runs.push((t.elapsed(), layer.last_times()?));
        }
    }
    let total_of =
        |r: &(Duration, Option<MhaTimes>)| r.1.map_or(r.0, |t| t.projection + t.attention);
    runs.sort_by_key(total_of);
    let (wall, pt) = runs[runs.len() / 2];
    let flops = 2.0 * (b * s.q_heads) as f64 * (prompt as f64).powi(2) * s.head_dim as f64
        + 2.0 * (b * prompt) as f64 * (e * (e + 2 * base.kv_dim()) + e * e) as f64;
    let dev = pt.map_or(wall, |t| t.projection + t.attention);
    let tflops = flops / dev.as_secs_f64() / 1e12;
    outln!(
        "prefill: {:.3} ms ({}), {tflops:.4} TFLOP/s (projections and causal attention; median of \
         {} runs)",
        dev.as_secs_f64() * 1e3,
        pt.map_or("wall".into(), |t| format!(
            "device: projections {:.3} ms, attention {:.3} ms",
            t.projection.as_secs_f64() * 1e3,
            t.attention.as_secs_f64() * 1e3
        )),
        runs.len()
    );
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    outln!(
        "bench: phase=mha_prefill L={prompt} runs={} wall_ms={:.4} device_ms={:.4} proj_ms={:.4} \
         attn_ms={:.4} tflops={}",
        runs.len(),
        wall.as_secs_f64() * 1e3,
        ms(pt.map(|t| t.projection + t.attention)),
        ms(pt.map(|t| t.projection)),
        ms(pt.map(|t| t.attention)),
        // Four significant digits: a tiny prefill on a loaded CPU driver is below 0.0001 TFLOP/s,
        // which four decimals printed as 0.
        if tflops >= 0.01 {
            format!("{tflops:.4}")
        } else {
            format!("{tflops:.3e}")
        },
    );

    let memory = args.cross.map(|len| rng.vec(b * len * e, 1.0));
    if let (Some(c), Some(m), Some(len)) = (cross.as_mut(), &memory, args.cross) {
        c.set_memory(m, None, len)?;
        let t = c.last_times()?;
        outln!(
            "memory:  {len} encoder positions projected once: {}",
            t.map_or("untimed".into(), |t| format!(
                "{:.3} ms",
                (t.projection + t.attention).as_secs_f64() * 1e3
            ))
        );
    }
    let mut self_times = StepTimes::default();
    let mut cross_times = StepTimes::default();
    let mut self_outs = Vec::new();
    let mut cross_outs = Vec::new();
    for i in 0..steps {
        let xi = rows(&x, prompt + i, 1);
        let t = Instant::now();
        let y = layer.step(&xi, None)?;
        self_times.push(t.elapsed(), layer.last_times()?);
        if let Some(c) = cross.as_mut() {
            // A decoder block: the cross-attention reads the self-attention's output.
            let t = Instant::now();
            let z = c.step(&y, None)?;
            cross_times.push(t.elapsed(), c.last_times()?);
            cross_outs.push((y.clone(), z));
        }
        self_outs.push(y);
    }
    if steps > 0 {
        self_times.report("self", total);
        if let Some(len) = args.cross {
            cross_times.report("cross", len);
        }
    }

    if !args.check {
        return Ok(ExitCode::SUCCESS);
    }
    let tolerance = match plan.dtype {
        KvDtype::F32 => 1e-4,
        KvDtype::F16 => 2e-3,
    };
    let want = multi_head_attention(
        &base,
        &view(&self_w),
        &RefCall {
            q_in: &x,
            k_in: &x,
            v_in: &x,
            q_len: total,
            kv_len: total,
            mask: None,
            causal: true,
        },
    )?;
    // The device's outputs in the reference's `[b][total][e]` order.
    let mut got = vec![0f32; b * total * e];
    for i in 0..b {
        got[i * total * e..][..prompt * e]
            .copy_from_slice(&prompt_out[i * prompt * e..][..prompt * e]);
        for (t, y) in self_outs.iter().enumerate() {
            got[(i * total + prompt + t) * e..][..e].copy_from_slice(&y[i * e..][..e]);
        }
    }
    let mut worst = relative_error(&got, &want);
    if let (Some(p), Some(w), Some(m), Some(len)) = (&cross_p, &cross_w, &memory, args.cross) {
        for (y, z) in &cross_outs {
            let call = RefCall {
                q_in: y,
                k_in: m,
                v_in: m,
                q_len: 1,
                kv_len: len,
                mask: None,
                causal: false,
            };
            let want = multi_head_attention(p, &view(w), &call)?;
            worst = worst.max(relative_error(z, &want));
        }
    }
    let ok = worst <= tolerance;
    outln!(
        "check:   |out - ref| / |ref| = {worst:.3e} (tolerance {tolerance:e}): {}",
        if ok { "ok" } else { "FAILED" }
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
