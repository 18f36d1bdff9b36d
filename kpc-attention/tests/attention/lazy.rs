//! `AttentionOptions::lazy` on real drivers: `attn_generic` (every shape parameter in push
//! constants) against the float64 reference over the shapes the specialized kernels support, and a
//! cold run that answers through it, then swaps to the specialized kernels once their background
//! builds are done. The `generic` seal makes "served generic" deterministic: under it nothing
//! specialized is built; unsealed, the first request of each specialized kernel queues its build
//! and is itself served the fallback, whatever the build's speed. Completion is waited for by a
//! deadline poll of the context's counters, never by time.

use std::time::{Duration, Instant};

use kpc::{Context, SealMode};
use kpc_attention::reference::{attention, relative_error};
use kpc_attention::{Attention, AttentionOptions, AttentionShape, KvCache, KvDtype, round_to_f16};

use super::{position, prefix, shape};
use crate::common::drivers::random_f32;

fn lazy_options(ctx: &Context) -> AttentionOptions {
    AttentionOptions {
        lazy: true,
        ..AttentionOptions::for_device(ctx.device())
    }
}

/// Waits (two minutes at most) until the context has no background build queued or running.
fn wait_background(ctx: &Context) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while ctx.stats().lazy.pending > 0 {
        assert!(Instant::now() < deadline, "background builds still pending");
        std::thread::yield_now();
    }
}

/// One causal sequence: a prefill of `prompt` positions, then decode steps, each checked against
/// the reference as it comes.
struct Run {
    s: AttentionShape,
    dtype: KvDtype,
    total: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    cache: KvCache,
    tolerance: f64,
}

impl Run {
    fn new(ctx: &Context, s: AttentionShape, dtype: KvDtype, total: usize) -> Run {
        let d = s.head_dim;
        let (rows_q, rows_kv) = (s.batch * s.q_heads, s.batch * s.kv_heads);
        let round = |x: Vec<f32>| match dtype {
            // Stored as f16: the reference sees what the cache holds.
            KvDtype::F16 => round_to_f16(&x),
            KvDtype::F32 => x,
        };
        Run {
            s,
            dtype,
            total,
            q: random_f32(rows_q * total * d),
            k: round(random_f32(rows_kv * total * d)),
            v: round(random_f32(rows_kv * total * d)),
            cache: KvCache::new(ctx, &s, total, dtype).unwrap(),
            tolerance: if dtype == KvDtype::F16 { 2e-3 } else { 1e-5 },
        }
    }

    fn rows(&self) -> (usize, usize, usize) {
        (
            self.s.batch * self.s.q_heads,
            self.s.batch * self.s.kv_heads,
            self.s.head_dim,
        )
    }

    /// The reference for queries [from, to) of the sequence, as `[bh][to - from][d]`.
    fn want(&self, from: usize, to: usize) -> Vec<f64> {
        let (rows_q, rows_kv, d) = self.rows();
        let q: Vec<f32> = (0..rows_q)
            .flat_map(|h| self.q[(h * self.total + from) * d..][..(to - from) * d].to_vec())
            .collect();
        let k = prefix(&self.k, rows_kv, self.total, d, to);
        let v = prefix(&self.v, rows_kv, self.total, d, to);
        attention(&self.s, &q, &k, &v, to - from, to, true).unwrap()
    }

    fn prefill(&mut self, ctx: &Context, attn: &Attention, prompt: usize) {
        let (rows_q, rows_kv, d) = self.rows();
        let qb = ctx
            .buffer_from(&prefix(&self.q, rows_q, self.total, d, prompt))
            .unwrap();
        let out = ctx
            .buffer_from(&vec![f32::NAN; rows_q * prompt * d])
            .unwrap();
        attn.prefill(
            &mut self.cache,
            &qb,
            &prefix(&self.k, rows_kv, self.total, d, prompt),
            &prefix(&self.v, rows_kv, self.total, d, prompt),
            prompt,
            &out,
        )
        .unwrap()
        .wait()
        .unwrap();
        self.check("prefill", &out.read().unwrap(), 0, prompt);
    }

    /// Attention over the cache's last `len` positions again, nothing appended.
    fn prefill_cached(&self, ctx: &Context, attn: &Attention, len: usize) {
        let (rows_q, _, d) = self.rows();
        let at = self.cache.len();
        let q: Vec<f32> = (0..rows_q)
            .flat_map(|h| self.q[(h * self.total + at - len) * d..][..len * d].to_vec())
            .collect();
        let qb = ctx.buffer_from(&q).unwrap();
        let out = ctx.buffer_from(&vec![f32::NAN; q.len()]).unwrap();
        attn.prefill_cached(&self.cache, &qb, len, &out)
            .unwrap()
            .wait()
            .unwrap();
        self.check("prefill over the cache", &out.read().unwrap(), at - len, at);
    }

    fn step(&mut self, ctx: &Context, attn: &Attention) {
        let (rows_q, rows_kv, d) = self.rows();
        let t = self.cache.len();
        let qb = ctx
            .buffer_from(&position(&self.q, rows_q, self.total, d, t))
            .unwrap();
        let out = ctx.buffer_from(&vec![f32::NAN; self.s.q_elems()]).unwrap();
        attn.decode_step(
            &mut self.cache,
            &qb,
            &position(&self.k, rows_kv, self.total, d, t),
            &position(&self.v, rows_kv, self.total, d, t),
            &out,
        )
        .unwrap()
        .wait()
        .unwrap();
        self.check("decode step", &out.read().unwrap(), t, t + 1);
    }

    fn check(&self, what: &str, got: &[f32], from: usize, to: usize) {
        let err = relative_error(got, &self.want(from, to));
        assert!(
            err <= self.tolerance,
            "{what} of positions {from}..{to}, {:?} {:?}: error {err:e}",
            self.s,
            self.dtype
        );
    }
}

/// `attn_generic` alone (the `generic` seal builds nothing specialized) over head dimensions 2 to
/// 256 (tails of its 64-wide loops included), grouped-query attention, batches, f32 and f16, a
/// prompt longer than one 64-position chunk and decode steps after it.
pub(crate) fn generic_kernel_matches_the_reference(ctx: &Context) {
    ctx.seal_with(SealMode::Generic);
    for (b, hq, hkv, d, prompt, steps) in [
        (1, 4, 4, 64, 1, 3),
        (1, 2, 2, 2, 9, 2),
        (2, 8, 2, 96, 70, 2),
        (1, 4, 1, 128, 33, 2),
        (1, 2, 1, 256, 5, 66),
    ] {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let s = shape(b, hq, hkv, d);
            let attn = Attention::new(ctx, &s, dtype, prompt + steps, lazy_options(ctx)).unwrap();
            let mut run = Run::new(ctx, s, dtype, prompt + steps);
            run.prefill(ctx, &attn, prompt);
            for _ in 0..steps {
                run.step(ctx, &attn);
            }
            run.prefill_cached(ctx, &attn, prompt.min(7));
            let r = attn.lazy_report().unwrap();
            assert_eq!(
                (r.specialized_calls, r.generic_calls, r.swapped),
                (0, steps as u64 + 2, 0),
                "{s:?} {dtype:?}"
            );
        }
    }
    let s = ctx.stats();
    assert_eq!(
        s.lazy.background_builds, 0,
        "the generic seal built nothing specialized"
    );
    assert!(s.lazy.sealed_generic > 0);
    ctx.seal_with(SealMode::Off);
}

/// A cold run: answered through `attn_generic` while sealed (a path's first call asks for nothing;
/// its second asks and is served the fallback, nothing queued), then unsealed (the next requests
/// queue the specialized builds and are served the fallback), then on the specialized kernels once
/// their background builds are done; every output checked against the reference.
pub(crate) fn a_cold_run_answers_generic_then_swaps(ctx: &Context, dtype: KvDtype) {
    let s = shape(1, 4, 2, 64);
    let (prompt, total) = (9, 15);
    ctx.seal_with(SealMode::Generic);
    let attn = Attention::new(ctx, &s, dtype, total, lazy_options(ctx)).unwrap();
    let mut run = Run::new(ctx, s, dtype, total);
    run.prefill(ctx, &attn, prompt);
    run.step(ctx, &attn);
    assert_eq!(
        ctx.stats().lazy.served_generic,
        0,
        "first calls ask for nothing"
    );
    run.step(ctx, &attn);
    run.prefill_cached(ctx, &attn, 4);
    let l = ctx.stats().lazy;
    assert_eq!(l.pending, 0, "nothing is queued under the seal");
    assert!(
        l.sealed_generic >= 2 && l.sealed_generic == l.served_generic,
        "{l:?}"
    );
    ctx.seal_with(SealMode::Off);
    // Unsealed: these requests queue every specialized kernel of both paths and are served the
    // fallback.
    run.step(ctx, &attn);
    run.prefill_cached(ctx, &attn, 3);
    let before = attn.lazy_report().unwrap();
    assert_eq!((before.generic_calls, before.specialized_calls), (6, 0));
    wait_background(ctx);
    run.step(ctx, &attn);
    run.step(ctx, &attn);
    run.prefill_cached(ctx, &attn, 5);
    let after = attn.lazy_report().unwrap();
    assert_eq!(
        (after.generic_calls, after.specialized_calls, after.swapped),
        (6, 3, 2),
        "both the decode and the prefill swapped"
    );
    let l = ctx.stats().lazy;
    assert!(l.swapped_in >= 2, "{l:?}");
    assert!(l.background_builds >= 2, "{l:?}");
    assert_eq!(l.background_failures, 0);
    assert!(l.served_generic >= 4, "{l:?}");
}
