//! The prefill cases of tests/attention.rs: causal prefill against the reference with each
//! prefill kernel, a prefill followed by decode steps, the cooperative-matrix prefill's choice and
//! checks, and chunked prefill.

use kpc::{Context, Error};
use kpc_attention::reference::{attention, relative_error};
use kpc_attention::{
    Attention, AttentionOptions, AttentionShape, KvCache, KvDtype, PrefillKernel, round_to_f16,
};

use super::mma_prefill::picks_mma;
use super::{position, prefix, shape};
use crate::common::drivers::random_f32;

/// Causal prefill of `len` positions against the reference.
pub(crate) fn prefill_case(
    ctx: &Context,
    s: AttentionShape,
    dtype: KvDtype,
    options: AttentionOptions,
    len: usize,
) -> f64 {
    prefill_case_scaled(ctx, s, dtype, options, len, 1.0)
}

/// [`prefill_case`] with the queries multiplied by `q_scale`: larger scores move each row's
/// running max, which exercises the softmax's rescaling.
pub(crate) fn prefill_case_scaled(
    ctx: &Context,
    s: AttentionShape,
    dtype: KvDtype,
    options: AttentionOptions,
    len: usize,
    q_scale: f32,
) -> f64 {
    let k = random_f32(s.kv_step_elems() * len);
    let v = random_f32(s.kv_step_elems() * len);
    let q: Vec<f32> = random_f32(s.q_elems() * len)
        .into_iter()
        .map(|x| x * q_scale)
        .collect();
    let attn = Attention::new(ctx, &s, dtype, len + 5, options).unwrap();
    let expect = match options.prefill {
        // Every shape prefill_shapes runs has a head dimension of 64 or 128.
        PrefillKernel::Auto if picks_mma(ctx, dtype, options.prefill) => PrefillKernel::Mma,
        PrefillKernel::Auto if picks_coop(ctx, dtype, options.prefill) => {
            PrefillKernel::Cooperative
        }
        PrefillKernel::Auto => PrefillKernel::Tiled,
        k => k,
    };
    assert_eq!(attn.prefill_kernel(), expect, "{s:?}");
    let mut cache = KvCache::new(ctx, &s, len + 5, dtype).unwrap();
    let qb = ctx.buffer_from(&q).unwrap();
    let out = ctx.buffer_from(&vec![f32::NAN; q.len()]).unwrap();
    attn.prefill(&mut cache, &qb, &k, &v, len, &out)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(cache.len(), len);
    // Again over the K/V the prefill wrote, nothing uploaded: the same output, bit for bit.
    let again = ctx.buffer_from(&vec![f32::NAN; q.len()]).unwrap();
    attn.prefill_cached(&cache, &qb, len, &again)
        .unwrap()
        .wait()
        .unwrap();
    let first = out.read().unwrap();
    assert!(
        first
            .iter()
            .zip(again.read().unwrap())
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{s:?} L={len}: prefill_cached differs from the prefill"
    );
    let (k, v) = match dtype {
        KvDtype::F32 => (k, v),
        KvDtype::F16 => (round_to_f16(&k), round_to_f16(&v)),
    };
    let want = attention(&s, &q, &k, &v, len, len, true).unwrap();
    relative_error(&first, &want)
}

pub(crate) fn prefill_shapes(ctx: &Context, dtype: KvDtype) {
    let prefetch = AttentionOptions::default().tiled_prefetch;
    for kernel in [PrefillKernel::Generic, PrefillKernel::Auto] {
        prefill_shapes_with(ctx, dtype, kernel, prefetch);
    }
    // The tiled kernel with its staging prefetch switched the other way, and as it runs by default
    // where Auto picked the cooperative kernel.
    prefill_shapes_with(ctx, dtype, PrefillKernel::Tiled, !prefetch);
    if picks_coop(ctx, dtype, PrefillKernel::Auto) {
        prefill_shapes_with(ctx, dtype, PrefillKernel::Tiled, prefetch);
    }
}

pub(crate) fn prefill_shapes_with(
    ctx: &Context,
    dtype: KvDtype,
    kernel: PrefillKernel,
    tiled_prefetch: bool,
) {
    let small = AttentionOptions {
        local_size: 16,
        block_q: 3,
        block_k: 5,
        prefill: kernel,
        tiled_prefetch,
        ..AttentionOptions::default()
    };
    let default = AttentionOptions {
        prefill: kernel,
        tiled_prefetch,
        ..AttentionOptions::default()
    };
    for (s, options, len) in [
        (shape(1, 2, 2, 64), default, 1),
        (shape(1, 2, 2, 64), default, 7),
        (shape(1, 2, 2, 64), small, 7),
        (shape(1, 2, 2, 128), default, 33),
        (shape(2, 4, 2, 64), small, 33),
        (shape(2, 4, 2, 64), default, 33),
        (shape(1, 4, 1, 64), default, 100),
        (shape(2, 2, 2, 128), default, 130),
        // The longest prompt the issue names, with GQA: many query and key tiles, most of them masked.
        (shape(1, 2, 1, 64), default, 1000),
    ] {
        let err = prefill_case(ctx, s, dtype, options, len);
        // Against K/V as stored; the cooperative-matrix kernel also rounds Q and P to fp16.
        let tolerance =
            if picks_coop(ctx, dtype, options.prefill) || picks_mma(ctx, dtype, options.prefill) {
                2e-3
            } else {
                1e-5
            };
        assert!(
            err <= tolerance,
            "{dtype:?} {s:?} {options:?} L={len}: prefill error {err:e}"
        );
    }
}

/// Whether `kernel` resolves to a cooperative-matrix prefill (KHR or NV cm2) here, for the head
/// dimensions 64 and 128 these tests use.
pub(crate) fn picks_coop(ctx: &Context, dtype: KvDtype, kernel: PrefillKernel) -> bool {
    matches!(
        kernel,
        PrefillKernel::Auto | PrefillKernel::Cooperative | PrefillKernel::Cm2
    ) && coop_capable(ctx)
        && dtype == KvDtype::F16
}

/// Whether the device has the workgroup-scope matrices the VK_NV_cooperative_matrix2 prefill needs
/// (at the default workgroup size).
pub(crate) fn cm2_capable(ctx: &Context) -> bool {
    coop_capable(ctx)
        && ctx.device().limits.cooperative_matrix2_workgroup
            >= AttentionOptions::default().cm2_local_size
}

/// The VK_NV_cooperative_matrix2 prefill: where the device has no workgroup-scope matrices
/// (lavapipe, PoCL, KHR-only devices), asking for it is a typed error naming what is missing and
/// Auto never picks it; where it has them, it matches the reference with several tiles, head
/// dimensions 128, 64 and 96, GQA, lengths that end mid-tile and scaled queries (Auto still takes
/// the KHR kernel where both fit). f32 K/V and tiles that are not multiples of 16 are typed errors
/// everywhere.
pub(crate) fn cm2_prefill_choice(ctx: &Context) {
    let forced = |rows: u32, keys: u32, local: u32| AttentionOptions {
        prefill: PrefillKernel::Cm2,
        cm2_rows: rows,
        cm2_keys: keys,
        cm2_local_size: local,
        ..AttentionOptions::default()
    };
    let s = shape(1, 4, 2, 64);
    for (dtype, options) in [
        (KvDtype::F32, forced(64, 64, 128)),
        (KvDtype::F16, forced(40, 64, 128)),
    ] {
        let e = Attention::new(ctx, &s, dtype, 64, options).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("VK_NV_cooperative_matrix2")),
            "{e}"
        );
    }
    if !cm2_capable(ctx) {
        let e = Attention::new(ctx, &s, KvDtype::F16, 64, forced(64, 64, 128)).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("cooperative_matrix")
                || m.contains("subgroups of 32")),
            "{e}"
        );
        let auto = Attention::new(ctx, &s, KvDtype::F16, 64, AttentionOptions::default()).unwrap();
        assert_ne!(auto.prefill_kernel(), PrefillKernel::Cm2);
        return;
    }
    // Where both fit, Auto takes the KHR kernel (measured faster: see BENCHMARKS.md).
    let auto = Attention::new(ctx, &s, KvDtype::F16, 64, AttentionOptions::default()).unwrap();
    assert_eq!(auto.prefill_kernel(), PrefillKernel::Cooperative);
    let most = ctx.device().limits.cooperative_matrix2_workgroup;
    for (rows, keys, local) in [(64, 64, 128), (128, 64, 256), (64, 32, 128), (32, 64, 64)] {
        if local > most {
            continue;
        }
        for (s, len, q_scale) in [
            (shape(1, 4, 2, 128), 200, 1.0),
            (shape(2, 4, 4, 64), 129, 1.0),
            (shape(1, 2, 1, 96), 77, 1.0),
            (shape(1, 4, 1, 128), 64, 1.0),
            (shape(1, 2, 2, 128), 333, 30.0),
            (shape(1, 2, 1, 64), 1, 1.0),
        ] {
            let err = prefill_case_scaled(
                ctx,
                s,
                KvDtype::F16,
                forced(rows, keys, local),
                len,
                q_scale,
            );
            assert!(
                err <= 2e-3,
                "{s:?} tile {rows}x{keys}/{local} len {len} q x{q_scale}: error {err:e}"
            );
        }
    }
}

/// Whether the device multiplies fp16 matrices the way the cooperative-matrix prefill needs.
pub(crate) fn coop_capable(ctx: &Context) -> bool {
    let l = &ctx.device().limits;
    l.cooperative_matrix_f16 && l.subgroup_size == Some(32)
}

/// The cooperative-matrix prefill: where the device has no such matrices (lavapipe, PoCL), asking
/// for it is a typed error naming what is missing and Auto never picks it; where it has them, it
/// matches the reference, with 128 and 64 rows per workgroup, head dimensions 128, 64 and 96,
/// lengths that end mid-tile, scaled queries, and the softmax in registers (where the layout probe
/// allows) and in shared memory. Wrong row counts and f32 K/V are typed errors everywhere.
pub(crate) fn coop_prefill_choice(ctx: &Context) {
    // One 16-row block per subgroup, 64-key tiles, prefetch (the first tile this kernel had);
    // the cases below vary the rest.
    let forced = |rows: u32| AttentionOptions {
        prefill: PrefillKernel::Cooperative,
        coop_rows: rows,
        coop_row_blocks: 1,
        coop_keys: 64,
        coop_prefetch: true,
        ..AttentionOptions::default()
    };
    let s = shape(1, 4, 2, 64);
    let e = Attention::new(ctx, &s, KvDtype::F32, 64, forced(128)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("cooperative-matrix")),
        "{e}"
    );
    let e = Attention::new(ctx, &s, KvDtype::F16, 64, forced(100)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("cooperative-matrix")),
        "{e}"
    );
    // Tiles the kernel does not have, refused by name on every device.
    for (bad, what) in [
        (
            AttentionOptions {
                coop_row_blocks: 3,
                ..forced(128)
            },
            "coop_row_blocks 3",
        ),
        (
            AttentionOptions {
                coop_keys: 48,
                ..forced(128)
            },
            "coop_keys 48",
        ),
        (
            AttentionOptions {
                coop_row_blocks: 2,
                ..forced(64)
            },
            "coop_rows 64",
        ),
    ] {
        let e = Attention::new(ctx, &s, KvDtype::F16, 64, bad).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("cooperative-matrix") && m.contains(what)),
            "{e}"
        );
    }
    if !coop_capable(ctx) {
        let e = Attention::new(ctx, &s, KvDtype::F16, 64, forced(128)).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("VK_KHR_cooperative_matrix")
                || m.contains("subgroups of 32")),
            "{e}"
        );
        let auto = Attention::new(ctx, &s, KvDtype::F16, 64, AttentionOptions::default()).unwrap();
        assert_ne!(auto.prefill_kernel(), PrefillKernel::Cooperative);
        return;
    }
    let shared = AttentionOptions {
        coop_registers: false,
        ..forced(128)
    };
    let attn = Attention::new(ctx, &s, KvDtype::F16, 64, shared).unwrap();
    assert!(!attn.coop_register_softmax());
    let registers = Attention::new(ctx, &s, KvDtype::F16, 64, forced(128))
        .unwrap()
        .coop_register_softmax();
    eprintln!("cooperative-matrix prefill: softmax in registers here: {registers}");
    for coop_registers in [true, false] {
        for (s, rows, len, q_scale) in [
            (shape(1, 4, 2, 128), 128, 200, 1.0),
            (shape(2, 4, 4, 64), 128, 129, 1.0),
            (shape(1, 2, 1, 96), 64, 77, 1.0),
            (shape(1, 4, 1, 128), 64, 64, 1.0),
            (shape(1, 2, 2, 128), 128, 333, 30.0),
            (shape(1, 2, 1, 64), 64, 300, 30.0),
        ] {
            let options = AttentionOptions {
                coop_registers,
                ..forced(rows)
            };
            let err = prefill_case_scaled(ctx, s, KvDtype::F16, options, len, q_scale);
            assert!(
                err <= 2e-3,
                "{s:?} rows {rows} len {len} q x{q_scale} registers {coop_registers}: error {err:e}"
            );
        }
    }
    // Two 16-row blocks per subgroup, 32- and 64-key tiles, with and without the prefetch, with
    // either softmax (the shared-memory one takes one block per subgroup, half the rows).
    for coop_registers in [true, false] {
        for (s, rows, blocks, keys, prefetch, q_shared, double, len, q_scale) in [
            (
                shape(1, 4, 2, 128),
                128,
                2,
                32,
                true,
                false,
                false,
                300,
                1.0,
            ),
            (
                shape(1, 4, 2, 128),
                128,
                2,
                32,
                false,
                false,
                false,
                129,
                30.0,
            ),
            (
                shape(2, 4, 4, 128),
                256,
                2,
                32,
                true,
                false,
                false,
                515,
                1.0,
            ),
            (
                shape(1, 2, 1, 64),
                256,
                2,
                64,
                false,
                false,
                false,
                77,
                30.0,
            ),
            (
                shape(1, 4, 2, 128),
                128,
                1,
                32,
                false,
                false,
                false,
                333,
                30.0,
            ),
            (
                shape(1, 2, 2, 128),
                64,
                1,
                64,
                false,
                false,
                false,
                200,
                1.0,
            ),
            (
                shape(1, 4, 2, 128),
                128,
                2,
                32,
                false,
                true,
                false,
                300,
                30.0,
            ),
            (shape(2, 4, 4, 128), 128, 2, 32, true, true, false, 515, 1.0),
            (
                shape(1, 4, 2, 128),
                128,
                2,
                32,
                false,
                false,
                true,
                300,
                30.0,
            ),
            (shape(2, 4, 4, 128), 128, 2, 32, true, false, true, 515, 1.0),
            (shape(1, 4, 1, 64), 64, 1, 64, true, false, true, 200, 1.0),
        ] {
            for half_exp in [false, true] {
                if half_exp && (q_shared || double) {
                    continue;
                }
                let options = AttentionOptions {
                    coop_registers,
                    coop_row_blocks: blocks,
                    coop_keys: keys,
                    coop_prefetch: prefetch,
                    coop_q_shared: q_shared,
                    coop_double: double,
                    coop_half_exp: half_exp,
                    ..forced(rows)
                };
                let err = prefill_case_scaled(ctx, s, KvDtype::F16, options, len, q_scale);
                assert!(
                    err <= 2e-3,
                    "{s:?} rows {rows} blocks {blocks} keys {keys} prefetch {prefetch} q in shared \
                 {q_shared} double {double} fp16 exp {half_exp} len {len} q x{q_scale} \
                 registers {coop_registers}: error {err:e}"
                );
            }
        }
    }
    // The second block's Q beside a 64-key tile of 8 subgroups needs more than 48 KiB of shared
    // memory at D = 128, which no device here has: refused by its size.
    if ctx.device().limits.max_shared_memory_bytes < 64 * 1024 {
        let big = AttentionOptions {
            coop_row_blocks: 2,
            coop_q_shared: true,
            ..forced(256)
        };
        let e = Attention::new(ctx, &shape(1, 2, 1, 128), KvDtype::F16, 64, big).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("bytes of shared memory")),
            "{e}"
        );
    }
    // D = 96 fits only 4 subgroups: Auto's tile has 4 (2 blocks of 16 rows each); with 8
    // subgroups of 1 block asked for, Auto takes 64 rows rather than giving up the kernel.
    for options in [
        AttentionOptions::default(),
        AttentionOptions {
            coop_row_blocks: 1,
            ..AttentionOptions::default()
        },
    ] {
        let auto = Attention::new(ctx, &shape(1, 2, 1, 96), KvDtype::F16, 64, options).unwrap();
        assert_eq!(auto.prefill_kernel(), PrefillKernel::Cooperative);
    }
}

/// A prompt prefilled in two chunks (the second attending the first's K/V in the cache) gives the
/// rows of one causal attention, with each prefill kernel.
pub(crate) fn chunked_prefill(ctx: &Context, dtype: KvDtype, tolerance: f64) {
    let s = shape(1, 4, 2, 64);
    let (first, second) = (37, 90);
    let total = first + second;
    let d = s.head_dim;
    let (rows_q, rows_kv) = (s.batch * s.q_heads, s.batch * s.kv_heads);
    let q = random_f32(rows_q * total * d);
    let k = random_f32(rows_kv * total * d);
    let v = random_f32(rows_kv * total * d);
    let (ks, vs) = match dtype {
        KvDtype::F32 => (k.clone(), v.clone()),
        KvDtype::F16 => (round_to_f16(&k), round_to_f16(&v)),
    };
    let want = attention(&s, &q, &ks, &vs, total, total, true).unwrap();
    // Rows [from, from + n) of `[h][len][d]`.
    let rows = |x: &[f32], h: usize, from: usize, n: usize| -> Vec<f32> {
        (0..h)
            .flat_map(|i| x[(i * total + from) * d..][..n * d].iter().copied())
            .collect()
    };
    for kernel in [PrefillKernel::Generic, PrefillKernel::Auto] {
        let options = AttentionOptions {
            prefill: kernel,
            ..AttentionOptions::default()
        };
        let attn = Attention::new(ctx, &s, dtype, total, options).unwrap();
        let mut cache = KvCache::new(ctx, &s, total, dtype).unwrap();
        let mut got = vec![f32::NAN; q.len()];
        for (from, n) in [(0, first), (first, second)] {
            let qb = ctx.buffer_from(&rows(&q, rows_q, from, n)).unwrap();
            let out = ctx.buffer_from(&vec![f32::NAN; rows_q * n * d]).unwrap();
            attn.prefill(
                &mut cache,
                &qb,
                &rows(&k, rows_kv, from, n),
                &rows(&v, rows_kv, from, n),
                n,
                &out,
            )
            .unwrap();
            let o = out.read().unwrap();
            for h in 0..rows_q {
                got[(h * total + from) * d..][..n * d].copy_from_slice(&o[h * n * d..][..n * d]);
            }
        }
        let err = relative_error(&got, &want);
        // The matrix kernels round Q and P to fp16 for their products.
        let tolerance = if picks_coop(ctx, dtype, kernel) || picks_mma(ctx, dtype, kernel) {
            tolerance.max(2e-3)
        } else {
            tolerance
        };
        assert!(
            err <= tolerance,
            "{dtype:?} {kernel:?}: chunked prefill error {err:e}"
        );
    }
}

/// A prompt prefilled, then 100 decode steps, give the rows of one causal attention over the whole
/// sequence.
pub(crate) fn prefill_then_decode(ctx: &Context, dtype: KvDtype, tolerance: f64) {
    let s = shape(2, 4, 2, 64);
    let (prompt, steps) = (13, 100);
    let total = prompt + steps;
    let d = s.head_dim;
    let rows_q = s.batch * s.q_heads;
    let rows_kv = s.batch * s.kv_heads;
    let q = random_f32(rows_q * total * d);
    let k = random_f32(rows_kv * total * d);
    let v = random_f32(rows_kv * total * d);
    let options = AttentionOptions {
        chunk: 32,
        decode_split_min: 32,
        ..AttentionOptions::default()
    };
    let attn = Attention::new(ctx, &s, dtype, total, options).unwrap();
    let mut cache = KvCache::new(ctx, &s, total, dtype).unwrap();
    let mut got = vec![f32::NAN; q.len()];

    let qb = ctx
        .buffer_from(&prefix(&q, rows_q, total, d, prompt))
        .unwrap();
    let out = ctx
        .buffer_from(&vec![f32::NAN; rows_q * prompt * d])
        .unwrap();
    attn.prefill(
        &mut cache,
        &qb,
        &prefix(&k, rows_kv, total, d, prompt),
        &prefix(&v, rows_kv, total, d, prompt),
        prompt,
        &out,
    )
    .unwrap();
    let o = out.read().unwrap();
    for h in 0..rows_q {
        got[h * total * d..][..prompt * d].copy_from_slice(&o[h * prompt * d..][..prompt * d]);
    }

    let qb = ctx.buffer::<f32>(s.q_elems()).unwrap();
    let out = ctx.buffer::<f32>(s.q_elems()).unwrap();
    for t in prompt..total {
        qb.write(&position(&q, rows_q, total, d, t)).unwrap();
        out.write(&vec![f32::NAN; s.q_elems()]).unwrap();
        attn.decode_step(
            &mut cache,
            &qb,
            &position(&k, rows_kv, total, d, t),
            &position(&v, rows_kv, total, d, t),
            &out,
        )
        .unwrap();
        let o = out.read().unwrap();
        for h in 0..rows_q {
            got[(h * total + t) * d..][..d].copy_from_slice(&o[h * d..][..d]);
        }
    }
    assert_eq!(cache.len(), total);
    let want = attention(&s, &q, &k, &v, total, total, true).unwrap();
    let err = relative_error(&got, &want);
    assert!(
        err <= tolerance,
        "{dtype:?}: prefill + {steps} decode steps differ from one causal attention by {err:e}"
    );
}
