//! Making an [`Attention`]: the kernel chosen per device and shape, acquired through the context's
//! caches, and the scratch its splits need; its accessors and the split arithmetic. Which decode
//! variant fits is decode_choice.rs's.

use kpc::BackendKind;
use kpc::{Context, Kernel};
use kpc::{Error, Result};
use kpc::{SpecConstants, SpecValue};

use super::choice::{
    auto_prefill, cm2_prefill_fits, coop_prefill_fits, coop_prefill_shared, coop_prefill_subgroups,
    coop_quad_layout, tiled_prefill_fits, tiled_prefill_shared, tiled_prefill_slice,
};
use super::decode_choice::{coop_decode_shared, vec_decode_shared, vec_layout, with_merge_all};
use super::prefill_mma::{
    mma_prefill_auto, mma_prefill_shape_fits, mma_prefill_shared, mma_prefill_spec,
};
use super::{
    Attention, AttentionOptions, AttentionShape, DecodeKernel, KvCache, KvDtype, LazyReport,
    PrefillKernel, shipped_kernel_from, shipped_request,
};

impl Attention {
    /// Acquires the kernels for `shape` and `dtype` (built, or served by the memory or disk cache)
    /// and allocates scratch for caches of up to `capacity` positions. The decode kernel is chosen
    /// per device ([`DecodeKernel::Auto`]); each variant is a distinct cached program.
    ///
    /// Errors: [`Error::InvalidArgument`] for an invalid shape, zero capacity, a local size that is
    /// not a power of two, a zero chunk or workgroup target, sizes whose shared memory exceeds the
    /// device's, or [`DecodeKernel::Vectorized`] asked for where it cannot run (the message says
    /// why); kernel build and allocation errors.
    pub fn new(
        ctx: &Context,
        shape: &AttentionShape,
        dtype: KvDtype,
        capacity: usize,
        options: AttentionOptions,
    ) -> Result<Attention> {
        shape.validate()?;
        if capacity == 0 {
            return Err(Error::InvalidArgument(
                "attention needs a capacity of at least one position".into(),
            ));
        }
        if !options.local_size.is_power_of_two()
            || options.chunk == 0
            || options.decode_split_min == 0
            || options.decode_workgroups == 0
            || !options.decode_local_size.is_power_of_two()
            || !(1..=16).contains(&options.decode_rows)
            || options.block_q == 0
            || options.block_k == 0
        {
            return Err(Error::InvalidArgument(format!(
                "local sizes must be powers of two, decode rows 1 to 16, and chunk, decode split \
                 minimum, decode workgroups and blocks positive: {options:?}"
            )));
        }
        let device = ctx.device();
        // The matrix decode runs in the vectorized kernel's launch (grid, scratch, push constants),
        // so it takes that layout too, which every shape and device it fits has.
        let coop_decode = Self::choose_coop_decode(ctx, shape, dtype, capacity, &options)?;
        let vec = match options.decode {
            DecodeKernel::Generic => None,
            DecodeKernel::Auto | DecodeKernel::Cooperative => vec_layout(
                device,
                shape,
                dtype,
                options.decode_local_size,
                options.decode_narrow,
            )
            .ok(),
            DecodeKernel::Vectorized => Some(
                vec_layout(
                    device,
                    shape,
                    dtype,
                    options.decode_local_size,
                    options.decode_narrow,
                )
                .map_err(|why| {
                    Error::InvalidArgument(format!(
                        "the vectorized decode kernel cannot run here: {why}"
                    ))
                })?,
            ),
        };
        let vec = vec.map(|v| {
            with_merge_all(
                v,
                device,
                shape,
                options.decode_local_size,
                options.decode_merge_all && !coop_decode,
            )
        });
        let mut options = options;
        let narrow = AttentionOptions {
            coop_rows: 64,
            coop_row_blocks: 1,
            ..options
        };
        if options.prefill == PrefillKernel::Auto
            && coop_prefill_fits(device, shape, dtype, &options).is_err()
            && coop_prefill_fits(device, shape, dtype, &narrow).is_ok()
        {
            // 4 subgroups of 16 rows also take head dimensions that are multiples of 32 only.
            options = narrow;
        }
        let prefill_kind = match options.prefill {
            PrefillKernel::Generic => PrefillKernel::Generic,
            PrefillKernel::Auto if mma_prefill_auto(ctx, shape, dtype, &options) => {
                PrefillKernel::Mma
            }
            PrefillKernel::Auto => auto_prefill(device, shape, dtype, &options),
            PrefillKernel::Mma => {
                crate::ptx::require_inline_ptx(ctx, "attn_prefill_mma")?;
                mma_prefill_shape_fits(shape, dtype, &options).map_err(|why| {
                    Error::InvalidArgument(format!(
                        "the mma.sync prefill kernel cannot run here: {why}"
                    ))
                })?;
                PrefillKernel::Mma
            }
            PrefillKernel::Cm2 => {
                cm2_prefill_fits(device, shape, dtype, &options).map_err(|why| {
                    Error::InvalidArgument(format!(
                        "the VK_NV_cooperative_matrix2 prefill kernel cannot run here: {why}"
                    ))
                })?;
                PrefillKernel::Cm2
            }
            PrefillKernel::Tiled => {
                tiled_prefill_fits(device, shape).map_err(|why| {
                    Error::InvalidArgument(format!(
                        "the tiled prefill kernel cannot run here: {why}"
                    ))
                })?;
                PrefillKernel::Tiled
            }
            PrefillKernel::Cooperative => {
                coop_prefill_fits(device, shape, dtype, &options).map_err(|why| {
                    Error::InvalidArgument(format!(
                        "the cooperative-matrix prefill kernel cannot run here: {why}"
                    ))
                })?;
                PrefillKernel::Cooperative
            }
        };
        let coop_quad = prefill_kind == PrefillKernel::Cooperative
            && options.coop_registers
            && coop_quad_layout(ctx)?;
        if prefill_kind == PrefillKernel::Cooperative && !coop_quad && options.coop_row_blocks != 1
        {
            // The shared-memory softmax keeps one 16-row block per subgroup (and 32-key tiles):
            // up to 128 rows over twice the subgroups where they fit (its measured best, before
            // the register softmax existed), else the same subgroups with half the rows.
            let wide = AttentionOptions {
                coop_rows: options.coop_rows.min(128),
                coop_row_blocks: 1,
                ..options
            };
            options = if coop_prefill_fits(device, shape, dtype, &wide).is_ok() {
                wide
            } else {
                AttentionOptions {
                    coop_rows: 16 * coop_prefill_subgroups(&options),
                    coop_row_blocks: 1,
                    ..options
                }
            };
        }
        let (bq, bk) = (options.block_q as usize, options.block_k as usize);
        let decode_shared = match vec {
            Some(_) if coop_decode => {
                coop_decode_shared(shape.head_dim, options.decode_local_size as usize)
            }
            None => 4 * (shape.head_dim + options.chunk as usize + options.local_size as usize),
            Some(v) => {
                let rg = (options.decode_local_size / v.lanes) as usize;
                let local_sum = if v.nv_shuffle || ctx.backend() == BackendKind::Vulkan {
                    0
                } else {
                    options.decode_local_size as usize
                        * options.decode_rows as usize
                        * (shape.q_heads / shape.kv_heads)
                };
                if ctx.backend() == BackendKind::Vulkan {
                    vec_decode_shared(
                        v,
                        shape.q_heads / shape.kv_heads,
                        shape.head_dim,
                        options.decode_local_size,
                        options.decode_merge_once,
                    )
                } else {
                    4 * (2 * rg + rg * shape.head_dim + local_sum)
                }
            }
        };
        let prefill_shared = match prefill_kind {
            PrefillKernel::Cooperative => coop_prefill_shared(
                shape.head_dim,
                coop_prefill_subgroups(&options) as usize,
                coop_quad,
                options.coop_keys as usize,
                options.coop_q_shared && options.coop_row_blocks == 2,
                options.coop_double,
            ),
            PrefillKernel::Tiled => tiled_prefill_shared(tiled_prefill_slice(device) as usize),
            PrefillKernel::Mma => mma_prefill_shared(shape.head_dim, &options),
            // It declares none: the driver stages its matrices in memory it reserves itself.
            PrefillKernel::Cm2 => 0,
            _ => 4 * (2 * bq * shape.head_dim + bq * bk + 3 * bq),
        };
        let shared = decode_shared.max(prefill_shared);
        let max_shared = device.limits.max_shared_memory_bytes as usize;
        if shared > max_shared {
            return Err(Error::InvalidArgument(format!(
                "{options:?} with head dimension {} needs {shared} bytes of shared memory; the \
                 device has {max_shared}",
                shape.head_dim
            )));
        }
        let d = SpecValue::U32(shape.head_dim as u32);
        let local = SpecValue::U32(options.local_size);
        let f16 = SpecValue::U32(u32::from(dtype == KvDtype::F16));
        let combine_all = coop_decode
            || vec.is_some_and(|v| {
                options.decode_combine_all
                    && ctx.backend() == BackendKind::Vulkan
                    && Self::combine_all_fits(shape, options, capacity, v.lanes)
            });
        let (decode_name, decode_spec) = match vec {
            None => (
                "attn_decode",
                SpecConstants::new()
                    .with(0, local)
                    .with(1, SpecValue::U32(options.chunk))
                    .with(2, f16)
                    .with(3, d),
            ),
            Some(_) if coop_decode => (
                "attn_decode_coop",
                SpecConstants::new()
                    .with(0, SpecValue::U32(options.decode_local_size))
                    .with(3, d)
                    .with(7, SpecValue::U32((shape.q_heads / shape.kv_heads) as u32)),
            ),
            Some(v) => {
                let mut spec = SpecConstants::new()
                    .with(0, SpecValue::U32(options.decode_local_size))
                    .with(2, f16)
                    .with(3, d)
                    .with(6, SpecValue::U32(v.lanes))
                    .with(7, SpecValue::U32((shape.q_heads / shape.kv_heads) as u32))
                    .with(9, SpecValue::U32(options.decode_rows))
                    .with(10, SpecValue::U32(u32::from(options.decode_spread)))
                    .with(11, SpecValue::U32(u32::from(options.decode_prefetch)))
                    .with(12, SpecValue::U32(u32::from(options.decode_cyclic)));
                if combine_all {
                    spec = spec.with(13, SpecValue::U32(1));
                }
                if Self::head_lanes_fit(ctx.backend(), shape, options, v.lanes) {
                    spec = spec.with(14, SpecValue::U32(1));
                }
                if v.narrow {
                    spec = spec.with(15, SpecValue::U32(1));
                }
                if v.merge_all {
                    spec = spec.with(16, SpecValue::U32(1));
                }
                if options.decode_merge_once && ctx.backend() == BackendKind::Vulkan {
                    spec = spec.with(18, SpecValue::U32(1));
                }
                if combine_all && Self::scan_fits(shape, options) {
                    spec = spec.with(17, SpecValue::U32(1));
                }
                if ctx.backend() == BackendKind::OpenCl {
                    spec = spec.with(8, SpecValue::U32(u32::from(v.nv_shuffle)));
                }
                ("attn_decode_vec", spec)
            }
        };
        // With `lazy`, every kernel is requested with the generic one as its fallback from its
        // path's second call on (see lazy.rs); the fields hold the generic kernel, for reporting.
        let generic = if options.lazy {
            let r = shipped_request(
                ctx,
                "attn_generic",
                &SpecConstants::new(),
                options.from_source,
            )?;
            Some((ctx.kernel_with(&r)?, r))
        } else {
            None
        };
        let mut lazy_requests = Vec::new();
        let mut acquire = |name: &str, spec: &SpecConstants| -> Result<Kernel> {
            match &generic {
                None => shipped_kernel_from(ctx, name, spec, options.from_source),
                Some((k, g)) => {
                    let r = shipped_request(ctx, name, spec, options.from_source)?
                        .or_generic(g.clone());
                    lazy_requests.push(r);
                    Ok(k.clone())
                }
            }
        };
        let decode = acquire(decode_name, &decode_spec)?;
        let (append, reduce) = if vec.is_some() {
            (None, None)
        } else {
            // The reduce shares its scans across the workgroup: as wide as the device allows, to
            // 256.
            let mut reduce_local = 256;
            while reduce_local > 32 && reduce_local > device.limits.max_workgroup_invocations {
                reduce_local /= 2;
            }
            let reduce_spec = SpecConstants::new()
                .with(0, SpecValue::U32(reduce_local))
                .with(3, d);
            let reduce = acquire("attn_reduce", &reduce_spec)?;
            let append_spec = SpecConstants::new().with(0, local).with(2, f16).with(3, d);
            let append = acquire("attn_append", &append_spec)?;
            (Some(append), Some(reduce))
        };
        let (prefill_name, prefill_spec) = match prefill_kind {
            PrefillKernel::Cm2 => (
                "attn_prefill_cm2",
                SpecConstants::new()
                    .with(0, SpecValue::U32(options.cm2_local_size))
                    .with(3, d)
                    .with(4, SpecValue::U32(options.cm2_rows))
                    .with(5, SpecValue::U32(options.cm2_keys)),
            ),
            PrefillKernel::Cooperative => (
                "attn_prefill_coop",
                SpecConstants::new()
                    .with(0, SpecValue::U32(32 * coop_prefill_subgroups(&options)))
                    .with(3, d)
                    .with(4, SpecValue::U32(u32::from(coop_quad)))
                    .with(5, SpecValue::U32(options.coop_row_blocks))
                    .with(6, SpecValue::U32(options.coop_keys))
                    .with(7, SpecValue::U32(u32::from(options.coop_prefetch)))
                    .with(8, SpecValue::U32(u32::from(options.coop_q_shared)))
                    .with(9, SpecValue::U32(u32::from(options.coop_double)))
                    .with(10, SpecValue::U32(u32::from(options.coop_half_exp))),
            ),
            PrefillKernel::Tiled => (
                "attn_prefill_tiled",
                SpecConstants::new()
                    .with(2, f16)
                    .with(3, d)
                    .with(6, SpecValue::U32(tiled_prefill_slice(device)))
                    .with(7, SpecValue::U32(u32::from(options.tiled_prefetch))),
            ),
            PrefillKernel::Mma => (
                "attn_prefill_mma",
                mma_prefill_spec(shape.head_dim, &options),
            ),
            _ => (
                "attn_prefill",
                SpecConstants::new()
                    .with(0, local)
                    .with(2, f16)
                    .with(3, d)
                    .with(4, SpecValue::U32(options.block_q))
                    .with(5, SpecValue::U32(options.block_k)),
            ),
        };
        let prefill = acquire(prefill_name, &prefill_spec)?;
        // In request order: decode, [reduce, append,] prefill.
        let lazy = generic.map(|(g, _)| {
            let prefill = lazy_requests.pop().expect("the prefill was requested");
            super::lazy::Lazy::new(g, lazy_requests, prefill)
        });
        let splits = match vec {
            None => capacity.div_ceil(options.chunk as usize),
            Some(_) => Self::vec_most_splits(shape, options, capacity),
        };
        let rows = shape.batch * shape.q_heads * splits;
        Ok(Attention {
            ctx: ctx.clone(),
            shape: *shape,
            dtype,
            capacity,
            options,
            vec,
            coop_decode,
            prefill_kind,
            coop_quad,
            combine_all,
            append,
            decode,
            reduce,
            prefill,
            part_o: ctx.buffer(rows * shape.head_dim)?,
            part_ml: ctx.buffer(rows * 2)?,
            done: ctx.buffer_from(&vec![0u32; shape.batch * shape.kv_heads])?,
            new_k: ctx.buffer(shape.kv_step_elems())?,
            new_v: ctx.buffer(shape.kv_step_elems())?,
            step: parking_lot::Mutex::new(()),
            lazy,
        })
    }

    /// Splits per (batch, KV head) that make about `decode_workgroups` workgroups, or half as
    /// many where a workgroup serves several query heads: on an H200 (B=1, Hq=32, Hkv=8, L=16k
    /// and 32k) 512 workgroups beat 1024 by 7 to 9%, and 256 lost; with one query head per
    /// workgroup 1024 beat 512 by 13% (BENCHMARKS.md).
    pub(super) fn vec_target(shape: &AttentionShape, options: AttentionOptions) -> usize {
        if options.decode_spread {
            return (options.decode_workgroups as usize)
                .div_ceil(shape.batch * shape.q_heads)
                .max(1);
        }
        let workgroups = if shape.q_heads > shape.kv_heads {
            (options.decode_workgroups / 2).max(1)
        } else {
            options.decode_workgroups
        };
        (workgroups as usize)
            .div_ceil(shape.batch * shape.kv_heads)
            .max(1)
    }

    /// Whether the vectorized decode merges the row groups of all its query heads at once (see
    /// [`AttentionOptions::decode_merge_all`]).
    pub fn decode_merges_all_heads(&self) -> bool {
        self.vec.is_some_and(|v| !self.coop_decode && v.merge_all)
    }

    /// Whether the vectorized decode merges its heads' row groups one after another with each
    /// head's max and sum found once (see [`AttentionOptions::decode_merge_once`]).
    pub fn decode_merges_once(&self) -> bool {
        self.vec.is_some_and(|v| {
            !self.coop_decode
                && !v.merge_all
                && self.options.decode_merge_once
                && self.ctx.backend() == BackendKind::Vulkan
        })
    }

    /// Whether the vectorized decode's combination reduces each head's split maxima and sums in
    /// parallel (see [`AttentionOptions::decode_scan`]).
    pub fn decode_parallel_scan(&self) -> bool {
        self.combine_all && !self.coop_decode && Self::scan_fits(&self.shape, self.options)
    }

    /// Invocations per K/V row of the vectorized decode and whether they load 8-byte chunks
    /// ([`AttentionOptions::decode_narrow`]); `None` where another decode kernel runs.
    pub fn decode_row_lanes(&self) -> Option<(u32, bool)> {
        self.vec
            .filter(|_| !self.coop_decode)
            .map(|v| (v.lanes, v.narrow))
    }

    /// Whether the vectorized decode shares a row's query heads out among its lanes (see
    /// [`AttentionOptions::decode_head_lanes`]).
    pub fn decode_head_lanes(&self) -> bool {
        self.vec.is_some_and(|v| {
            !self.coop_decode
                && Self::head_lanes_fit(self.ctx.backend(), &self.shape, self.options, v.lanes)
        })
    }

    /// The shape.
    pub fn shape(&self) -> &AttentionShape {
        &self.shape
    }

    /// The sizes in use.
    pub fn options(&self) -> AttentionOptions {
        self.options
    }

    /// The decode kernel chosen: [`DecodeKernel::Generic`], [`DecodeKernel::Vectorized`] or
    /// [`DecodeKernel::Cooperative`].
    pub fn decode_kernel(&self) -> DecodeKernel {
        match self.vec {
            Some(_) if self.coop_decode => DecodeKernel::Cooperative,
            Some(_) => DecodeKernel::Vectorized,
            None => DecodeKernel::Generic,
        }
    }

    /// The prefill kernel chosen: [`PrefillKernel::Generic`], [`PrefillKernel::Tiled`],
    /// [`PrefillKernel::Cooperative`], [`PrefillKernel::Cm2`] or [`PrefillKernel::Mma`].
    pub fn prefill_kernel(&self) -> PrefillKernel {
        self.prefill_kind
    }

    /// Whether the vectorized decode combines all query heads of a KV head at once: asked for
    /// ([`AttentionOptions::decode_combine_all`]), on Vulkan, and fitting at this shape and
    /// capacity. Otherwise it combines them one after another.
    pub fn decode_combines_all_heads(&self) -> bool {
        self.combine_all
    }

    /// Whether the prefill is the cooperative-matrix kernel with its softmax in registers: asked
    /// for ([`AttentionOptions::coop_registers`]) and found possible by the layout probe.
    pub fn coop_register_softmax(&self) -> bool {
        self.coop_quad
    }

    /// What [`AttentionOptions::lazy`] did: calls run on `attn_generic` and on the specialized
    /// kernels, and the paths that swapped; `None` without it.
    pub fn lazy_report(&self) -> Option<LazyReport> {
        self.lazy.as_ref().map(|l| l.report())
    }

    /// Every kernel it holds, for reporting where each came from and how long it took to acquire
    /// (with [`AttentionOptions::lazy`], `attn_generic` alone: the specialized kernels are acquired
    /// at each call).
    pub fn kernels(&self) -> Vec<&Kernel> {
        if let Some(l) = &self.lazy {
            return vec![l.generic()];
        }
        [
            Some(&self.prefill),
            self.append.as_ref(),
            Some(&self.decode),
            self.reduce.as_ref(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Splits a decode step over `len` positions (the newest one appended by the step) uses.
    pub fn splits(&self, len: usize) -> usize {
        self.split_sizes(len, true).1
    }

    /// Positions per split and splits for a decode over `len` positions, the newest appended by
    /// the step where `append`. The vectorized kernel sizes its splits by the positions it reads
    /// from the cache: the appended one goes to the last split whatever its range, so a step over
    /// 4096 + 1 positions takes 32 splits of 128 rows, not 33 (the last for one row), and one over
    /// 16384 + 1 takes 64 of 256, not 64 of 257 (a ninth trip of one row for every workgroup).
    pub(super) fn split_sizes(&self, len: usize, append: bool) -> (usize, usize) {
        match self.vec {
            None => {
                let per = self.options.chunk as usize;
                (per, len.div_ceil(per))
            }
            Some(_) => {
                let rows = if append { len.saturating_sub(1) } else { len }.max(1);
                let per = rows
                    .div_ceil(Self::vec_target(&self.shape, self.options))
                    .max(self.options.decode_split_min as usize);
                (per, rows.div_ceil(per))
            }
        }
    }

    /// The most splits the vectorized decode uses over at most `capacity` positions.
    pub(super) fn vec_most_splits(
        shape: &AttentionShape,
        options: AttentionOptions,
        capacity: usize,
    ) -> usize {
        capacity
            .div_ceil(options.decode_split_min as usize)
            .min(Self::vec_target(shape, options))
    }

    pub(super) fn check_cache(&self, cache: &KvCache) -> Result<()> {
        let s = cache.shape();
        if s.batch != self.shape.batch
            || s.kv_heads != self.shape.kv_heads
            || s.head_dim != self.shape.head_dim
        {
            return Err(Error::InvalidArgument(format!(
                "the KV cache's shape {s:?} does not match the attention's {:?}",
                self.shape
            )));
        }
        if cache.dtype() != self.dtype {
            return Err(Error::InvalidArgument(format!(
                "the KV cache holds {:?}; these kernels read {:?}",
                cache.dtype(),
                self.dtype
            )));
        }
        if cache.capacity() > self.capacity {
            return Err(Error::Size {
                what: "KV cache capacity".into(),
                got: format!("{} positions", cache.capacity()),
                expected: format!("at most {} (the attention's capacity)", self.capacity),
            });
        }
        Ok(())
    }
}
