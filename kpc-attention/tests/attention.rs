//! Attention with a KV cache on real drivers (lavapipe and PoCL in CI), checked against the float64
//! reference by ‖out − ref‖ / ‖ref‖: at most 1e-5 with f32 K/V, 2e-3 with f16. Inputs are fresh
//! random numbers each run and outputs are poisoned with NaN before every launch.

use kpc::BackendKind;
use kpc::{Context, Error};
use kpc_attention::reference::{attention, relative_error};
use kpc_attention::{
    Attention, AttentionOptions, AttentionShape, DecodeKernel, KvCache, KvDtype, round_to_f16,
};

use crate::common::drivers::{opencl_context, random_f32, vulkan_context};

mod coop_decode;
mod lazy;
mod mma_prefill;
mod prefill;
use coop_decode::coop_decode_choice;
use prefill::{
    chunked_prefill, cm2_prefill_choice, coop_prefill_choice, prefill_shapes, prefill_then_decode,
};

fn shape(batch: usize, q_heads: usize, kv_heads: usize, head_dim: usize) -> AttentionShape {
    AttentionShape {
        batch,
        q_heads,
        kv_heads,
        head_dim,
    }
}

/// `[bh][len][d]` rows with position `pos` of each (batch, head) taken out as `[bh][d]`.
fn position<T: Copy>(x: &[T], heads: usize, len: usize, d: usize, pos: usize) -> Vec<T> {
    (0..heads)
        .flat_map(|h| x[(h * len + pos) * d..][..d].iter().copied())
        .collect()
}

/// The first `n` positions of `[bh][len][d]`.
fn prefix(x: &[f32], heads: usize, len: usize, d: usize, n: usize) -> Vec<f32> {
    (0..heads)
        .flat_map(|h| x[h * len * d..][..n * d].iter().copied())
        .collect()
}

/// Fills a cache with `len - 1` random positions, decodes the `len`-th with `decode_step`, and
/// returns the relative error against the reference on the exact inputs and on the inputs as the
/// cache stores them.
fn decode_case(
    ctx: &Context,
    s: AttentionShape,
    dtype: KvDtype,
    options: AttentionOptions,
    len: usize,
    expect: DecodeKernel,
) -> (f64, f64) {
    let d = s.head_dim;
    let kv_rows = s.batch * s.kv_heads;
    let k = random_f32(kv_rows * len * d);
    let v = random_f32(kv_rows * len * d);
    let q = random_f32(s.q_elems());
    let capacity = len + 3;
    let attn = Attention::new(ctx, &s, dtype, capacity, options).expect("attention kernels");
    assert_eq!(attn.decode_kernel(), expect, "{s:?} {options:?}");
    let mut cache = KvCache::new(ctx, &s, capacity, dtype).unwrap();
    let (k_past, v_past) = (
        prefix(&k, kv_rows, len, d, len - 1),
        prefix(&v, kv_rows, len, d, len - 1),
    );
    cache.fill(&k_past, &v_past, len - 1).unwrap();
    let qb = ctx.buffer_from(&q).unwrap();
    let out = ctx.buffer_from(&vec![f32::NAN; s.q_elems()]).unwrap();
    attn.decode_step(
        &mut cache,
        &qb,
        &position(&k, kv_rows, len, d, len - 1),
        &position(&v, kv_rows, len, d, len - 1),
        &out,
    )
    .unwrap()
    .wait()
    .unwrap();
    assert_eq!(cache.len(), len);
    let got = out.read().unwrap();
    let exact = attention(&s, &q, &k, &v, 1, len, true).unwrap();
    let stored = match dtype {
        KvDtype::F32 => exact.clone(),
        KvDtype::F16 => {
            attention(&s, &q, &round_to_f16(&k), &round_to_f16(&v), 1, len, true).unwrap()
        }
    };
    (relative_error(&got, &exact), relative_error(&got, &stored))
}

/// Vectorized decode variants: spread over query heads, next rows prefetched, block-cyclic
/// splits, all query heads combined at once.
#[derive(Clone, Copy)]
struct VecVariant {
    spread: bool,
    prefetch: bool,
    cyclic: bool,
    combine_all: bool,
    head_lanes: bool,
    /// 8-byte chunks (Vulkan), the row groups of all heads merged at once, each head's row-group
    /// max found once, the combination's split maxima reduced in parallel.
    narrow: bool,
    merge_all: bool,
    merge_once: bool,
    scan: bool,
}

/// The shapes every backend runs, with each decode kernel: MHA at D = 64 and 128, GQA, B > 1,
/// L = 1, 7, 33, 1000, with the default chunk and with a small one that makes many splits; the
/// vectorized kernel with each of its variants on and off.
///
/// Every shape runs with the generic kernel and with the vectorized kernel's first variant. The
/// other variants change how a KV head's splits are assigned, fetched and combined, not what a
/// shape selects (head dimension, group size, batch), so they run the shapes that have many
/// splits, a group, a batch and long splits: [`VARIANT_CASES`]. Each (variant, head dimension,
/// group) is a kernel the driver compiles at first use, and compiling the full cross product of
/// variants and shapes was most of this file's 10 minutes on CPU drivers (BENCHMARKS.md,
/// "Fresh-machine build").
fn decode_shapes(ctx: &Context, dtype: KvDtype, tolerance: f64) {
    let v = |spread, prefetch, cyclic, combine_all, head_lanes| VecVariant {
        spread,
        prefetch,
        cyclic,
        combine_all,
        head_lanes,
        narrow: false,
        merge_all: false,
        merge_once: true,
        scan: true,
    };
    for (kernel, variant, cases) in [
        (
            DecodeKernel::Generic,
            v(false, true, false, true, true),
            ALL_CASES,
        ),
        (
            DecodeKernel::Auto,
            v(false, false, false, true, true),
            ALL_CASES,
        ),
        (
            DecodeKernel::Auto,
            VecVariant {
                merge_all: true,
                scan: false,
                ..v(false, true, true, true, true)
            },
            VARIANT_CASES,
        ),
        (
            DecodeKernel::Auto,
            VecVariant {
                narrow: true,
                merge_once: false,
                ..v(false, false, true, false, false)
            },
            VARIANT_CASES,
        ),
        (
            DecodeKernel::Auto,
            VecVariant {
                narrow: true,
                ..v(false, false, false, true, true)
            },
            VARIANT_CASES,
        ),
        (
            DecodeKernel::Auto,
            v(true, true, false, false, false),
            VARIANT_CASES,
        ),
        (
            DecodeKernel::Auto,
            v(true, false, true, true, true),
            VARIANT_CASES,
        ),
    ] {
        decode_shapes_with(ctx, dtype, tolerance, kernel, variant, cases);
    }
}

/// Which option set a decode case runs with.
#[derive(Clone, Copy)]
enum Opts {
    Default,
    /// Small splits: many per KV head.
    Small,
    /// Two workgroups: long splits, each row group looping many times.
    Long,
}

/// (batch, query heads, KV heads, head dimension), options, length.
type DecodeCase = ((usize, usize, usize, usize), Opts, usize);

const ALL_CASES: &[DecodeCase] = &[
    ((1, 4, 4, 64), Opts::Default, 1),
    ((1, 4, 4, 64), Opts::Small, 1),
    ((1, 4, 4, 64), Opts::Small, 7),
    ((1, 4, 4, 64), Opts::Small, 33),
    ((1, 2, 2, 128), Opts::Default, 33),
    ((2, 8, 2, 64), Opts::Small, 33),
    ((3, 4, 1, 128), Opts::Small, 7),
    ((1, 4, 2, 128), Opts::Default, 1000),
    ((2, 4, 2, 64), Opts::Small, 1000),
    ((1, 8, 1, 128), Opts::Long, 1000),
    ((2, 4, 4, 64), Opts::Long, 77),
];

/// For the vectorized kernel's other variants: MHA with many splits and a partial last one, a
/// group of 4 over a batch of 2 with many splits (the all-heads combination, spread over query
/// heads), a group of 8 at D = 128 with long splits (prefetch and cyclic order across many trips),
/// and MHA with long splits at L = 77 (a tail inside a trip).
const VARIANT_CASES: &[DecodeCase] = &[
    ((1, 4, 4, 64), Opts::Small, 33),
    ((2, 8, 2, 64), Opts::Small, 33),
    ((1, 8, 1, 128), Opts::Long, 1000),
    ((2, 4, 4, 64), Opts::Long, 77),
];

fn decode_shapes_with(
    ctx: &Context,
    dtype: KvDtype,
    tolerance: f64,
    kernel: DecodeKernel,
    variant: VecVariant,
    cases: &[DecodeCase],
) {
    let default = AttentionOptions {
        decode: kernel,
        decode_spread: variant.spread,
        decode_prefetch: variant.prefetch,
        decode_cyclic: variant.cyclic,
        decode_combine_all: variant.combine_all,
        decode_head_lanes: variant.head_lanes,
        decode_narrow: variant.narrow,
        decode_merge_all: variant.merge_all,
        decode_merge_once: variant.merge_once,
        decode_scan: variant.scan,
        ..AttentionOptions::default()
    };
    let small = AttentionOptions {
        local_size: 32,
        chunk: 16,
        decode_split_min: 16,
        block_q: 4,
        block_k: 8,
        ..default
    };
    // Few workgroups: long splits, each row group of the vectorized kernel looping many times.
    let long = AttentionOptions {
        decode_workgroups: 2,
        ..default
    };
    for &((b, hq, hkv, d), opts, len) in cases {
        let s = shape(b, hq, hkv, d);
        let options = match opts {
            Opts::Default => default,
            Opts::Small => small,
            Opts::Long => long,
        };
        // Every shape here fits the vectorized kernel, and both CI drivers can run it (lavapipe has
        // subgroup shuffles; OpenCL sums a row's lanes through local memory).
        let expect = match kernel {
            DecodeKernel::Auto => DecodeKernel::Vectorized,
            k => k,
        };
        let (exact, stored) = decode_case(ctx, s, dtype, options, len, expect);
        assert!(
            exact <= tolerance && stored <= 1e-5,
            "{dtype:?} {s:?} {options:?} L={len}: error {exact:e} (against the inputs as stored: \
             {stored:e})"
        );
    }
}

/// A static K/V set (an encoder's output) filled once and attended by several queries without
/// appending.
fn cross_attention(ctx: &Context) {
    let s = shape(2, 4, 2, 64);
    let len = 21;
    let k = random_f32(s.kv_step_elems() * len);
    let v = random_f32(s.kv_step_elems() * len);
    let attn = Attention::new(ctx, &s, KvDtype::F32, len, AttentionOptions::default()).unwrap();
    let mut cache = KvCache::new(ctx, &s, len, KvDtype::F32).unwrap();
    cache.fill(&k, &v, len).unwrap();
    for _ in 0..3 {
        let q = random_f32(s.q_elems());
        let qb = ctx.buffer_from(&q).unwrap();
        let out = ctx.buffer_from(&vec![f32::NAN; s.q_elems()]).unwrap();
        attn.attend(&cache, &qb, &out).unwrap().wait().unwrap();
        let want = attention(&s, &q, &k, &v, 1, len, false).unwrap();
        let err = relative_error(&out.read().unwrap(), &want);
        assert!(err <= 1e-5, "cross-attention error {err:e}");
        assert_eq!(cache.len(), len, "attend must not append");
    }
}

/// Shapes that do not fit are typed errors, and a failed append leaves the cache as it was.
fn bad_shapes(ctx: &Context) {
    let s = shape(1, 4, 2, 64);
    let e = KvCache::new(ctx, &shape(1, 6, 4, 64), 8, KvDtype::F32).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = Attention::new(
        ctx,
        &shape(1, 4, 3, 64),
        KvDtype::F32,
        8,
        AttentionOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");

    let attn = Attention::new(ctx, &s, KvDtype::F32, 2, AttentionOptions::default()).unwrap();
    let mut cache = KvCache::new(ctx, &s, 2, KvDtype::F32).unwrap();
    let row = vec![0.5f32; s.kv_step_elems()];
    let q = ctx.buffer_from(&vec![0.0f32; s.q_elems()]).unwrap();
    let out = ctx.buffer::<f32>(s.q_elems()).unwrap();

    // Attending an empty cache, wrong appended sizes, wrong q and out sizes.
    assert!(matches!(
        attn.attend(&cache, &q, &out).unwrap_err(),
        Error::InvalidArgument(_)
    ));
    let e = cache.append(&row[1..], &row).unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    let short_q = ctx.buffer::<f32>(s.q_elems() - 1).unwrap();
    let e = attn
        .decode_step(&mut cache, &short_q, &row, &row, &out)
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    let e = attn
        .decode_step(&mut cache, &q, &row, &row, &short_q)
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    assert_eq!(cache.len(), 0, "failed calls appended nothing");

    // Appending past capacity.
    attn.decode_step(&mut cache, &q, &row, &row, &out).unwrap();
    attn.decode_step(&mut cache, &q, &row, &row, &out).unwrap();
    let e = attn
        .decode_step(&mut cache, &q, &row, &row, &out)
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    assert_eq!(cache.len(), 2);
    let e = attn
        .prefill(&mut cache, &q, &row, &row, 1, &out)
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    let e = attn
        .prefill(&mut cache, &q, &row, &row, 0, &out)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert_eq!(cache.len(), 2);
    // Attending over the cache: 0 positions, or more than it holds.
    for len in [0, 3] {
        let e = attn.prefill_cached(&cache, &q, len, &out).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "len {len}: {e}");
    }
    let e = attn.prefill_cached(&cache, &short_q, 1, &out).unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    let e = cache
        .fill(
            &vec![0.0; 3 * s.kv_step_elems()],
            &vec![0.0; 3 * s.kv_step_elems()],
            3,
        )
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");

    // A cache of another type, shape or a larger capacity than the kernels' scratch.
    let f16 = KvCache::new(ctx, &s, 2, KvDtype::F16).unwrap();
    assert!(matches!(
        attn.attend(&f16, &q, &out).unwrap_err(),
        Error::InvalidArgument(_)
    ));
    let other = KvCache::new(ctx, &shape(1, 4, 4, 64), 2, KvDtype::F32).unwrap();
    assert!(matches!(
        attn.attend(&other, &q, &out).unwrap_err(),
        Error::InvalidArgument(_)
    ));
    let big = KvCache::new(ctx, &s, 3, KvDtype::F32).unwrap();
    assert!(matches!(
        attn.attend(&big, &q, &out).unwrap_err(),
        Error::Size { .. }
    ));
}

/// Decode steps on device buffers, submitted back to back with no wait between them (as a model's
/// layers would), each with its own query, new K/V row and output: every output matches its row of
/// one causal attention, so each step's append landed before its split kernel read the cache.
fn back_to_back_decode(ctx: &Context, dtype: KvDtype, tolerance: f64) {
    let s = shape(2, 8, 2, 64);
    let (prompt, steps) = (50, 20);
    let total = prompt + steps;
    let d = s.head_dim;
    let rows_q = s.batch * s.q_heads;
    let rows_kv = s.batch * s.kv_heads;
    let q = random_f32(rows_q * total * d);
    let k = random_f32(rows_kv * total * d);
    let v = random_f32(rows_kv * total * d);
    let attn = Attention::new(ctx, &s, dtype, total, AttentionOptions::default()).unwrap();
    let mut cache = KvCache::new(ctx, &s, total, dtype).unwrap();
    cache
        .fill(
            &prefix(&k, rows_kv, total, d, prompt),
            &prefix(&v, rows_kv, total, d, prompt),
            prompt,
        )
        .unwrap();
    let mut outs = Vec::new();
    let mut last = None;
    for t in prompt..total {
        let qb = ctx.buffer_from(&position(&q, rows_q, total, d, t)).unwrap();
        let kb = ctx
            .buffer_from(&position(&k, rows_kv, total, d, t))
            .unwrap();
        let vb = ctx
            .buffer_from(&position(&v, rows_kv, total, d, t))
            .unwrap();
        let out = ctx.buffer_from(&vec![f32::NAN; s.q_elems()]).unwrap();
        last = Some(attn.decode(&mut cache, &qb, &kb, &vb, &out).unwrap());
        outs.push(out);
    }
    last.unwrap().wait().unwrap();
    assert_eq!(cache.len(), total);
    let (ks, vs) = match dtype {
        KvDtype::F32 => (k.clone(), v.clone()),
        KvDtype::F16 => (round_to_f16(&k), round_to_f16(&v)),
    };
    let want = attention(&s, &q, &ks, &vs, total, total, true).unwrap();
    for (i, out) in outs.iter().enumerate() {
        let t = prompt + i;
        let err = relative_error(&out.read().unwrap(), &position(&want, rows_q, total, d, t));
        assert!(
            err <= tolerance,
            "{dtype:?} step at position {t}: error {err:e}"
        );
    }
    // A device-buffer step with rows of the wrong size launches nothing.
    let short = ctx.buffer::<f32>(s.kv_step_elems() - 1).unwrap();
    let qb = ctx.buffer::<f32>(s.q_elems()).unwrap();
    let mut small = KvCache::new(ctx, &s, total, dtype).unwrap();
    let e = attn
        .decode(&mut small, &qb, &short, &short, &qb)
        .unwrap_err();
    assert!(matches!(e, Error::Size { .. }), "{e}");
    assert_eq!(small.len(), 0);
}

/// Auto picks the generic kernel where the vectorized one cannot run; asking for the vectorized one
/// there is a typed error that says why.
fn decode_kernel_choice(ctx: &Context) {
    // All query heads are combined at once on Vulkan where asked for and where every split's max
    // and sum fit the kernel's 1024 (8 query heads per KV head, up to 512 splits: 4096 do not).
    let vulkan = ctx.backend() == BackendKind::Vulkan;
    for (s, capacity, asked, expect) in [
        (shape(1, 8, 2, 128), 64, true, vulkan),
        (shape(1, 8, 2, 128), 64, false, false),
        (shape(1, 8, 1, 128), 64 * 512, true, false),
        (shape(1, 4, 4, 64), 1000, true, vulkan),
    ] {
        let options = AttentionOptions {
            decode_combine_all: asked,
            ..AttentionOptions::for_device(ctx.device())
        };
        let a = Attention::new(ctx, &s, KvDtype::F16, capacity, options).unwrap();
        assert_eq!(a.decode_kernel(), DecodeKernel::Vectorized, "{s:?}");
        assert_eq!(
            a.decode_combines_all_heads(),
            expect,
            "{s:?} capacity {capacity}, asked {asked}"
        );
    }
    // A row's query heads are shared out among its lanes on Vulkan, where asked for, for groups
    // that are a power of two (2 fits any lane count the kernel uses), not for MHA, a group of 3,
    // or one workgroup per query head.
    for (s, asked, spread, expect) in [
        (shape(1, 4, 2, 64), true, false, vulkan),
        (shape(1, 4, 2, 64), false, false, false),
        (shape(1, 4, 2, 64), true, true, false),
        (shape(1, 4, 4, 64), true, false, false),
        (shape(1, 6, 2, 64), true, false, false),
    ] {
        let options = AttentionOptions {
            decode_head_lanes: asked,
            decode_spread: spread,
            ..AttentionOptions::for_device(ctx.device())
        };
        let a = Attention::new(ctx, &s, KvDtype::F16, 64, options).unwrap();
        assert_eq!(a.decode_kernel(), DecodeKernel::Vectorized, "{s:?}");
        assert_eq!(
            a.decode_head_lanes(),
            expect,
            "{s:?} asked {asked}, spread {spread}"
        );
    }
    // 8-byte chunks on Vulkan where asked for (a row of 128 halves then takes up to 32 lanes, as
    // the subgroup allows), never on OpenCL; the all-heads merge where asked for and on Vulkan;
    // the parallel scan of the combination by default where the group is a power of two.
    let sg = ctx.device().limits.subgroup_size.unwrap_or(32);
    for (s, narrow, merge_all) in [
        (shape(1, 8, 2, 64), true, true),
        (shape(1, 8, 2, 128), false, false),
        (shape(1, 6, 2, 64), true, false),
    ] {
        let options = AttentionOptions {
            decode_narrow: narrow,
            decode_merge_all: merge_all,
            ..AttentionOptions::for_device(ctx.device())
        };
        let a = Attention::new(ctx, &s, KvDtype::F16, 64, options).unwrap();
        // Powers of two: as many lanes as the row has chunks, up to 16 (32 narrow) and, on
        // Vulkan, the subgroup.
        let (most, elems) = match (vulkan, narrow) {
            (true, true) => (sg.min(32), 4),
            (true, false) => (sg.min(16), 8),
            (false, _) => (16, 8),
        };
        let lanes = most.min(s.head_dim as u32 / elems);
        assert_eq!(
            a.decode_row_lanes(),
            Some((lanes, narrow && vulkan)),
            "{s:?} narrow {narrow}"
        );
        assert_eq!(a.decode_merges_all_heads(), merge_all && vulkan, "{s:?}");
        assert_eq!(a.decode_merges_once(), !merge_all && vulkan, "{s:?}");
        let group = s.q_heads / s.kv_heads;
        assert_eq!(
            a.decode_parallel_scan(),
            vulkan && group.is_power_of_two(),
            "{s:?}"
        );
    }
    // The vectorized kernel sizes a step's splits by the rows it reads from the cache (the
    // appended position rides the last split): 32 cached rows + 1 in 16-row splits are 2 splits,
    // 33 + 1 are 3.
    let small = AttentionOptions {
        decode_split_min: 16,
        ..AttentionOptions::for_device(ctx.device())
    };
    let a = Attention::new(ctx, &shape(1, 4, 4, 64), KvDtype::F16, 100, small).unwrap();
    assert_eq!(a.decode_kernel(), DecodeKernel::Vectorized);
    for (len, splits) in [(1, 1), (17, 1), (18, 2), (33, 2), (34, 3), (100, 7)] {
        assert_eq!(a.splits(len), splits, "a step over {len} positions");
    }
    // D = 6 does not split into 16-byte loads; 16 query heads per KV head exceed the kernel's 8.
    for (s, dtype) in [
        (shape(1, 2, 2, 6), KvDtype::F32),
        (shape(1, 2, 2, 12), KvDtype::F16),
        (shape(1, 16, 1, 64), KvDtype::F16),
    ] {
        let auto = Attention::new(ctx, &s, dtype, 40, AttentionOptions::default()).unwrap();
        assert_eq!(auto.decode_kernel(), DecodeKernel::Generic, "{s:?}");
        let e = Attention::new(
            ctx,
            &s,
            dtype,
            40,
            AttentionOptions {
                decode: DecodeKernel::Vectorized,
                ..AttentionOptions::default()
            },
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("vectorized")),
            "{e}"
        );
        // The fallback computes the right thing.
        let tolerance = if dtype == KvDtype::F16 { 2e-3 } else { 1e-5 };
        let (exact, _) = decode_case(
            ctx,
            s,
            dtype,
            AttentionOptions::default(),
            40,
            DecodeKernel::Generic,
        );
        assert!(exact <= tolerance, "{s:?}: error {exact:e}");
    }
}

macro_rules! backend_tests {
    ($backend:ident, $context:ident) => {
        mod $backend {
            use super::*;

            #[test]
            fn lazy_generic_kernel_matches_the_reference() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_lazy_generic")) else {
                    return;
                };
                lazy::generic_kernel_matches_the_reference(&ctx);
            }

            #[test]
            fn lazy_cold_run_answers_generic_then_swaps() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_lazy_swap")) else {
                    return;
                };
                lazy::a_cold_run_answers_generic_then_swaps(&ctx, KvDtype::F32);
                let Some(ctx) = $context(concat!(stringify!($backend), "_lazy_swap_f16")) else {
                    return;
                };
                lazy::a_cold_run_answers_generic_then_swaps(&ctx, KvDtype::F16);
            }

            #[test]
            fn decode_f32_matches_the_reference() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_decode_f32")) else {
                    return;
                };
                decode_shapes(&ctx, KvDtype::F32, 1e-5);
            }

            #[test]
            fn decode_f16_matches_the_reference() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_decode_f16")) else {
                    return;
                };
                decode_shapes(&ctx, KvDtype::F16, 2e-3);
            }

            #[test]
            fn prefill_matches_the_reference() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_prefill")) else {
                    return;
                };
                prefill_shapes(&ctx, KvDtype::F32);
                prefill_shapes(&ctx, KvDtype::F16);
            }

            #[test]
            fn prefill_then_100_decode_steps_is_one_causal_attention() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_prefill_decode")) else {
                    return;
                };
                prefill_then_decode(&ctx, KvDtype::F32, 1e-5);
                prefill_then_decode(&ctx, KvDtype::F16, 2e-3);
            }

            #[test]
            fn back_to_back_device_decode_steps_are_ordered() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_back_to_back")) else {
                    return;
                };
                back_to_back_decode(&ctx, KvDtype::F32, 1e-5);
                back_to_back_decode(&ctx, KvDtype::F16, 2e-3);
            }

            #[test]
            fn decode_kernel_is_chosen_per_device_and_shape() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_kernel_choice")) else {
                    return;
                };
                decode_kernel_choice(&ctx);
            }

            #[test]
            fn coop_decode_only_where_asked_and_able() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_coop_decode")) else {
                    return;
                };
                coop_decode_choice(&ctx);
            }

            #[test]
            fn coop_prefill_is_chosen_per_device() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_coop_prefill")) else {
                    return;
                };
                coop_prefill_choice(&ctx);
            }

            #[test]
            fn mma_prefill_is_chosen_per_device() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_mma_prefill")) else {
                    return;
                };
                mma_prefill::mma_prefill_choice(&ctx);
            }

            #[test]
            fn cm2_prefill_is_chosen_per_device() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_cm2_prefill")) else {
                    return;
                };
                cm2_prefill_choice(&ctx);
            }

            #[test]
            fn chunked_prefill_is_one_causal_attention() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_chunked_prefill")) else {
                    return;
                };
                chunked_prefill(&ctx, KvDtype::F32, 1e-5);
                chunked_prefill(&ctx, KvDtype::F16, 1e-5);
            }

            #[test]
            fn cross_attention_attends_a_static_set() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_cross_attention")) else {
                    return;
                };
                cross_attention(&ctx);
            }

            #[test]
            fn bad_shapes_are_typed_errors() {
                let Some(ctx) = $context(concat!(stringify!($backend), "_bad_shapes")) else {
                    return;
                };
                bad_shapes(&ctx);
            }
        }
    };
}

backend_tests!(vulkan, vulkan_context);
backend_tests!(opencl, opencl_context);
