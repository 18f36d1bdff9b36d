//! `kpc attention`: a prompt's causal prefill and N decode steps with a KV cache, on the selected
//! device. Prints where each kernel came from (built, memory, disk, readonly, store) and how long it
//! took to acquire, prefill time and TFLOP/s, decode µs per step and GB/s next to the device's copy
//! bandwidth measured in the same run, and with `--check` the error against the float64 reference.

use std::process::ExitCode;
use std::time::{Duration, Instant};

pub use crate::attention_args::{Args, Plan, plan};
use crate::attention_measure::{Rng, copy_bandwidth, shipped, stream_time, timed};
use crate::attention_report::{Report, say};
use kpc::Source;
use kpc::{Config, Context};
use kpc_attention::{
    Attention, AttentionOptions, AttentionShape, DecodeKernel, KvCache, KvDtype, PrefillKernel,
};

/// The kernels `kpc attention` uses, as [`Attention::new`] and the copy-bandwidth measurement
/// acquire them on `ctx`.
pub fn acquire_kernels(ctx: &Context, plan: &Plan, args: &Args) -> kpc::Result<Vec<kpc::Kernel>> {
    let total = args.prompt + args.steps;
    let attn = Attention::new(ctx, &plan.shape, plan.dtype, total, plan.options)?;
    let mut v: Vec<kpc::Kernel> = attn.kernels().into_iter().cloned().collect();
    v.push(shipped(ctx, "copy")?);
    Ok(v)
}

pub fn run(config: &Config, args: &Args) -> kpc::Result<ExitCode> {
    let Plan {
        device,
        shape,
        dtype,
        options,
    } = plan(config, args)?;
    if args.layer == crate::attention_args::LayerArg::Mha {
        let plan = Plan {
            device,
            shape,
            dtype,
            options,
        };
        return crate::attention_mha::run(config, args, plan);
    }
    if args.cross.is_some() {
        return Err(kpc::Error::InvalidArgument(
            "--cross needs --layer mha (cross-attention is a MultiHeadAttention layer)".into(),
        ));
    }
    if args.layers.is_some() {
        return Err(kpc::Error::InvalidArgument(
            "--layers needs --layer mha (a decoder stack of MultiHeadAttention layers)".into(),
        ));
    }
    let ctx = Context::builder()
        .device(&device)
        .config(config.clone())
        .build()?;
    crate::attention_report::seal_before_first_acquisition(&ctx);
    let mut report = Report::default();
    let result = workload(&mut report, args, &device, &ctx, shape, dtype, options);
    report.print(result.is_ok());
    crate::attention_report::seal_summary(&ctx);
    crate::attention_report::lazy_summary(&ctx);
    let code = result?;
    for l in ctx.stats().stores {
        if l.kind == kpc::StoreKind::Remote {
            // What the fleet's cache did for this run (KPC_CACHE_REMOTE).
            let s = l.store;
            outln!(
                "{}: {} hits, {} misses, {} errors, {} bytes read, {} published ({} bytes)",
                l.name,
                s.hits,
                s.misses,
                s.errors,
                s.bytes_read,
                s.puts,
                s.bytes_written
            );
        }
    }
    if config.cache_debug {
        // KPC_CACHE_DEBUG: every program above was built fresh and compared with the cached binary.
        outln!("cache debug: {}", ctx.stats().cache_debug);
    }
    Ok(code)
}

/// Everything `kpc attention` runs on `ctx`, up to its exit status.
fn workload(
    log: &mut Report,
    args: &Args,
    device: &kpc::DeviceInfo,
    ctx: &Context,
    shape: AttentionShape,
    dtype: KvDtype,
    options: AttentionOptions,
) -> kpc::Result<ExitCode> {
    let (prompt, steps) = (args.prompt, args.steps);
    let total = prompt + steps;
    let d = shape.head_dim;
    say!(
        log,
        "kpc attention: B={} Hq={} Hkv={} D={} prompt={} steps={} kv={:?}",
        shape.batch,
        shape.q_heads,
        shape.kv_heads,
        d,
        prompt,
        steps,
        dtype
    );
    say!(log, "{}", crate::attention_report::device_line(device));
    log.what = format!(
        "causal prefill of {prompt} positions, then {steps} decode steps with a KV cache \
         (batch {}, {} query / {} KV heads, head dim {d}, {dtype:?} K/V)",
        shape.batch, shape.q_heads, shape.kv_heads
    );
    log.device = format!(
        "{}:{} {} ({}), driver {}",
        device.backend, device.index, device.name, device.device_type, device.driver
    );

    let attn = Attention::new(ctx, &shape, dtype, total, options)?;
    let (copy_bw, copy_kernel) = copy_bandwidth(ctx)?;
    let decode_how = match attn.decode_kernel() {
        DecodeKernel::Cooperative => format!(", {} invocations", options.decode_local_size),
        DecodeKernel::Vectorized => {
            format!(
                ", {} splits, {}",
                if options.decode_cyclic {
                    "block-cyclic"
                } else {
                    "contiguous"
                },
                if attn.decode_combines_all_heads() {
                    "heads combined at once"
                } else {
                    "heads combined one by one"
                }
            ) + if attn.decode_head_lanes() {
                ", heads shared out among a row's lanes"
            } else {
                ""
            } + &attn
                .decode_row_lanes()
                .map(|(lanes, narrow)| {
                    format!(
                        ", {lanes} lanes per row of {}-byte loads",
                        if narrow { 8 } else { 16 }
                    )
                })
                .unwrap_or_default()
                + if attn.decode_merges_all_heads() {
                    ", row groups merged for all heads at once"
                } else {
                    ""
                }
                + if attn.decode_merges_once() {
                    ", each head's row-group max found once"
                } else {
                    ""
                }
                + if attn.decode_parallel_scan() {
                    ", split maxima reduced in parallel"
                } else {
                    ""
                }
        }
        _ => String::new(),
    };
    say!(
        log,
        "kernels (decode: {:?}{decode_how}, prefill: {:?}{}):",
        attn.decode_kernel(),
        attn.prefill_kernel(),
        match (attn.prefill_kernel(), attn.coop_register_softmax()) {
            (PrefillKernel::Cooperative, true) => format!(
                ", softmax in registers, {} rows ({} x 16 per subgroup) x {} keys, prefetch {}, \
                 Q in shared memory {}, two K/V buffers {}, fp16 exponentials {}",
                options.coop_rows,
                options.coop_row_blocks,
                options.coop_keys,
                options.coop_prefetch,
                options.coop_q_shared,
                options.coop_double,
                options.coop_half_exp
            ),
            (PrefillKernel::Cooperative, false) => ", softmax in shared memory".to_string(),
            (PrefillKernel::Cm2, _) => format!(
                ", VK_NV_cooperative_matrix2, {} rows x {} keys, {} invocations",
                options.cm2_rows, options.cm2_keys, options.cm2_local_size
            ),
            (PrefillKernel::Tiled, _) if options.tiled_prefetch => {
                ", next step prefetched".to_string()
            }
            (PrefillKernel::Tiled, _) => ", no prefetch".to_string(),
            (PrefillKernel::Mma, _) => format!(
                ", mma.sync through inline PTX, {} warps x {} x 16 rows x {} keys, lazy rescale {}, \
                 {} stages, swizzle {}, Q shared {}, half exp {}",
                options.mma_warps,
                options.mma_row_blocks,
                options.mma_keys,
                options.mma_lazy_rescale,
                options.mma_stages,
                options.mma_swizzle,
                options.mma_q_shared,
                options.mma_half_exp
            ),
            _ => String::new(),
        }
    );
    for k in attn.kernels().into_iter().chain([&copy_kernel]) {
        // A store hit the driver compiled anyway (lavapipe: its pipeline cache is a stub) saved
        // the build's lookup but not its compile; the driver's creation feedback says which.
        let stored = !matches!(k.source(), Source::Built | Source::Memory | Source::Blob);
        let recompiled = stored && k.driver_cache_hit() == Some(false);
        log.kernels.push((
            k.name().to_string(),
            if recompiled {
                format!("{} (compiled again by the driver)", k.source())
            } else {
                k.source().to_string()
            },
            k.acquire_time().as_secs_f64() * 1e3,
        ));
        say!(
            log,
            "  {:<16} {:<8} {:>10.3} ms{}",
            k.name(),
            k.source().to_string(),
            k.acquire_time().as_secs_f64() * 1e3,
            if recompiled {
                "  (compiled again by the driver: no compile saved)"
            } else {
                ""
            }
        );
        if args.from_source {
            match k.spirv_step() {
                Some(step) => say!(log, "    spirv: {step}"),
                None => say!(log, "    spirv: committed"),
            }
        }
        if !k.driver_stats().is_empty() {
            let stats: Vec<String> = k
                .driver_stats()
                .iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            say!(log, "    driver: {}", stats.join(", "));
        }
    }

    if let Some(d) = ctx.stats().disk.filter(|d| d.hits > 0) {
        outln!(
            "disk cache: {} hits, {} of them compiled again by the driver; build time saved {:.1} ms \
             ({:.1} ms served but recompiled)",
            d.hits,
            d.recompiled_hits,
            d.build_time_saved.as_secs_f64() * 1e3,
            d.build_time_recompiled.as_secs_f64() * 1e3
        );
    }

    let rows_q = shape.batch * shape.q_heads;
    let rows_kv = shape.batch * shape.kv_heads;
    let mut rng = Rng::new();
    let mut cache = KvCache::new(ctx, &shape, total, dtype)?;
    // What the check compares: every K/V row `[rows_kv][total][d]`, and the prompt's outputs.
    let keep = args.check;
    let mut all_k = Vec::new();
    let mut all_v = Vec::new();
    let mut prompt_q = Vec::new();
    let mut prompt_out = Vec::new();

    if args.fill {
        // In pieces of about 16M elements, so that long contexts need no full host copy.
        let piece = ((1usize << 24) / (rows_kv * d)).max(1);
        if keep {
            all_k = vec![0.0; rows_kv * total * d];
            all_v = vec![0.0; rows_kv * total * d];
        }
        let mut pos = 0;
        while pos < prompt {
            let n = piece.min(prompt - pos);
            let (kc, vc) = (rng.vec(rows_kv * n * d), rng.vec(rows_kv * n * d));
            cache.write(pos, n, &kc, &vc)?;
            if keep {
                for h in 0..rows_kv {
                    let at = (h * total + pos) * d;
                    all_k[at..][..n * d].copy_from_slice(&kc[h * n * d..][..n * d]);
                    all_v[at..][..n * d].copy_from_slice(&vc[h * n * d..][..n * d]);
                }
            }
            pos += n;
        }
        say!(
            log,
            "prefill: skipped (--fill: the prompt's K/V were uploaded)"
        );
    } else {
        let mut q = rng.vec(rows_q * prompt * d);
        q.iter_mut().for_each(|x| *x *= args.q_scale);
        let k = rng.vec(rows_kv * prompt * d);
        let v = rng.vec(rows_kv * prompt * d);
        let qb = ctx.buffer_from(&q)?;
        let out = ctx.buffer_from(&vec![f32::NAN; rows_q * prompt * d])?;
        // The first run writes the prompt's K/V and is not timed: drivers that compile at the first
        // dispatch (lavapipe's LLVM, with Mesa's shader cache cold, took 3 s there) would make it
        // a compile measurement. The timed runs attend over the K/V it wrote.
        attn.prefill(&mut cache, &qb, &k, &v, prompt, &out)?
            .wait()?;
        if args.prefill_runs > 1 {
            // Later runs attend over the K/V the first one wrote: re-uploading them each time
            // left the GPU idle for most of each run, and its clocks fell between short
            // prefills (an L = 2k prefill measured 3x slower in some runs on an H200). Untimed
            // runs for at least 300 ms come first, as before the decode steps.
            let warm = Instant::now();
            while warm.elapsed() < Duration::from_millis(300) {
                attn.prefill_cached(&cache, &qb, prompt, &out)?.wait()?;
            }
        }
        let mut times = (0..args.prefill_runs.max(1))
            .map(|_| timed(|| attn.prefill_cached(&cache, &qb, prompt, &out)))
            .collect::<kpc::Result<Vec<_>>>()?;
        times.sort();
        let prefill_time = times[times.len() / 2];
        log.prefill_ms = Some(prefill_time.as_secs_f64() * 1e3);
        // Causal: about half of the L x L scores, two matmuls of 2 * D flops each.
        let flops = 2.0 * rows_q as f64 * (prompt as f64).powi(2) * d as f64;
        say!(
            log,
            "prefill: {:.3} ms, {:.4} TFLOP/s (causal, 2*B*H*L^2*D flops)",
            prefill_time.as_secs_f64() * 1e3,
            flops / prefill_time.as_secs_f64() / 1e12
        );
        say!(
            log,
            "bench: phase=prefill L={prompt} ms={:.4} tflops={:.4}",
            prefill_time.as_secs_f64() * 1e3,
            flops / prefill_time.as_secs_f64() / 1e12
        );
        if keep {
            all_k = vec![0.0; rows_kv * total * d];
            all_v = vec![0.0; rows_kv * total * d];
            for h in 0..rows_kv {
                let at = h * total * d;
                all_k[at..][..prompt * d].copy_from_slice(&k[h * prompt * d..][..prompt * d]);
                all_v[at..][..prompt * d].copy_from_slice(&v[h * prompt * d..][..prompt * d]);
            }
            prompt_q = q;
            prompt_out = out.read()?;
        }
    }

    // Decode: each step's query and new K/V row live in device buffers (as a model's projections
    // leave them); steps are submitted back to back with one wait at the end, as a model's layers
    // would run, and each is one submission (append, splits and their combination: one launch on
    // the vectorized path, three on the generic one).
    let mut step_q = Vec::new();
    let mut bufs = Vec::with_capacity(steps);
    for t in 0..steps {
        let (q, k, v) = (
            rng.vec(rows_q * d),
            rng.vec(rows_kv * d),
            rng.vec(rows_kv * d),
        );
        bufs.push((
            ctx.buffer_from(&q)?,
            ctx.buffer_from(&k)?,
            ctx.buffer_from(&v)?,
            ctx.buffer_from(&vec![f32::NAN; shape.q_elems()])?,
        ));
        if keep {
            for h in 0..rows_kv {
                let at = (h * total + prompt + t) * d;
                all_k[at..][..d].copy_from_slice(&k[h * d..][..d]);
                all_v[at..][..d].copy_from_slice(&v[h * d..][..d]);
            }
            step_q.push(q);
        }
    }
    if steps > 0 {
        // Warm-up for at least 300 ms, rolled back each time: the GPU leaves its idle clocks only
        // under sustained load (one H200 read 345 MHz idle, 1980 MHz busy), and the upload before
        // this left it idle.
        let warm = Instant::now();
        while warm.elapsed() < Duration::from_millis(300) {
            let mut last = None;
            for (q, k, v, o) in bufs.iter().take(16) {
                last = Some(attn.decode(&mut cache, q, k, v, o)?);
            }
            if let Some(e) = last {
                e.wait()?;
            }
            cache.truncate(prompt);
        }
        // Several repetitions of all the steps, rolled back between; the median of each figure.
        const REPS: usize = 5;
        let mut walls = Vec::with_capacity(REPS);
        let mut hosts = Vec::with_capacity(REPS);
        let mut devices = Vec::with_capacity(REPS);
        let mut each: Vec<Vec<f64>> = Vec::new();
        let mut timed = true;
        for _ in 0..REPS {
            cache.truncate(prompt);
            for (_, _, _, o) in &bufs {
                o.write(&vec![f32::NAN; shape.q_elems()])?;
            }
            let t = Instant::now();
            let mut events = Vec::with_capacity(steps);
            let mut host = Duration::ZERO;
            for (q, k, v, o) in &bufs {
                let s = Instant::now();
                events.push(attn.decode(&mut cache, q, k, v, o)?);
                host += s.elapsed();
            }
            if let Some(last) = events.last() {
                last.wait()?;
            }
            walls.push(t.elapsed().as_secs_f64());
            hosts.push(host.as_secs_f64());
            let mut device = 0.0;
            let mut launches: Vec<f64> = Vec::new();
            for e in &events {
                match (e.device_time()?, e.launch_times()?) {
                    (Some(span), Some(times)) => {
                        device += span.as_secs_f64();
                        launches.resize(times.len(), 0.0);
                        for (sum, t) in launches.iter_mut().zip(times) {
                            *sum += t.as_secs_f64();
                        }
                    }
                    _ => timed = false,
                }
            }
            devices.push(device);
            each.resize(launches.len(), Vec::new());
            for (v, x) in each.iter_mut().zip(launches) {
                v.push(x);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let wall = median(&mut walls);
        let host = median(&mut hosts);
        let device = median(&mut devices);
        let launches: Vec<f64> = each.into_iter().map(|mut v| median(&mut v)).collect();
        let bytes: f64 = (prompt..total)
            .map(|p| 2.0 * (rows_kv * (p + 1) * d * dtype.bytes()) as f64)
            .sum();
        let n = steps as f64;
        let wall_us = wall / n * 1e6;
        let host_us = host / n * 1e6;
        let gbs_wall = bytes / wall / 1e9;
        log.decode_us = Some(wall_us);
        say!(
            log,
            "decode:  {wall_us:.1} us/step wall, back to back ({steps} steps of append + split + \
             reduce, {} splits at L={prompt}; median of {REPS} runs), {gbs_wall:.2} GB/s of K/V \
             read",
            attn.splits(prompt + 1)
        );
        say!(
            log,
            "host:    {host_us:.1} us/step inside Attention::decode (recording and submitting)"
        );
        let names: Vec<String> = attn
            .kernels()
            .iter()
            .skip(1) // the prefill
            .map(|k| k.name().to_string())
            .collect();
        let per_launch = launches
            .iter()
            .map(|x| format!("{:.2}", x / n * 1e6))
            .collect::<Vec<_>>()
            .join("/");
        let (dev_us, gbs_dev) = if timed {
            say!(
                log,
                "device:  {:.1} us/step from the first launch's start to the last one's end \
                 ({} us: {}), {:.2} GB/s",
                device / n * 1e6,
                per_launch,
                names.join(" / "),
                bytes / device / 1e9
            );
            (device / n * 1e6, bytes / device / 1e9)
        } else {
            (f64::NAN, f64::NAN)
        };
        say!(
            log,
            "copy:    {:.2} GB/s (copy kernel, same run); decode/copy = {:.1}% on the device, {:.1}% \
             wall",
            copy_bw / 1e9,
            100.0 * gbs_dev * 1e9 / copy_bw,
            100.0 * gbs_wall * 1e9 / copy_bw
        );
        // The floor at this size: the copy kernel moving a step's bytes (half read, half
        // written), so the fixed cost of one launch and the ramp of a short stream show.
        let step_bytes = bytes / n;
        let same_us = stream_time(
            ctx,
            &copy_kernel,
            (step_bytes / 32.0).round() as usize,
            false,
        )?
        .as_secs_f64()
            * 1e6;
        say!(
            log,
            "copy:    {same_us:.1} us for a copy moving one step's {:.1} MB: decode/that copy = \
             {:.1}% on the device",
            step_bytes / 1e6,
            100.0 * same_us / dev_us
        );
        // The floor of a kernel that only reads a step's bytes, as a decode step does.
        let read_us = stream_time(
            ctx,
            &shipped(ctx, "read")?,
            (step_bytes / 16.0).round() as usize,
            true,
        )?
        .as_secs_f64()
            * 1e6;
        say!(
            log,
            "read:    {read_us:.1} us for a read of one step's {:.1} MB: decode/that read = \
             {:.1}% on the device",
            step_bytes / 1e6,
            100.0 * read_us / dev_us
        );
        say!(
            log,
            "bench: phase=decode L={prompt} wall_us={wall_us:.2} device_us={dev_us:.2} \
             host_us={host_us:.1} launches_us={per_launch} \
             splits={} gbs={gbs_dev:.1} copy_gbs={:.1} pct_device={:.1} pct_wall={:.1} \
             copy_same_us={same_us:.2} pct_same={:.1} read_same_us={read_us:.2} pct_read={:.1}",
            attn.splits(prompt + 1),
            copy_bw / 1e9,
            100.0 * gbs_dev * 1e9 / copy_bw,
            100.0 * gbs_wall * 1e9 / copy_bw,
            100.0 * same_us / dev_us,
            100.0 * read_us / dev_us
        );
    } else {
        say!(
            log,
            "copy:    {:.2} GB/s (copy kernel, same run)",
            copy_bw / 1e9
        );
    }

    if let Some(r) = attn.lazy_report() {
        say!(
            log,
            "lazy:    {} calls on attn_generic, {} on the specialized kernels, {} of 2 paths \
             swapped (prefill, decode)",
            r.generic_calls,
            r.specialized_calls,
            r.swapped
        );
    }

    if args.check {
        let step_out = bufs
            .iter()
            .map(|(_, _, _, o)| o.read())
            .collect::<kpc::Result<Vec<_>>>()?;
        let run = crate::attention_check::Run {
            shape: &shape,
            dtype,
            prompt,
            total,
            all_k: &all_k,
            all_v: &all_v,
            prompt_q: &prompt_q,
            prompt_out: &prompt_out,
            step_q: &step_q,
            step_out: &step_out,
        };
        let (worst, tolerance) = run.error()?;
        log.check = Some((worst, tolerance));
        let ok = worst <= tolerance;
        say!(
            log,
            "check:   |out - ref| / |ref| = {worst:.3e} (tolerance {tolerance:e}): {}",
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}
