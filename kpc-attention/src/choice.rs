//! Which prefill kernel runs on which device: what each variant needs (shared memory, subgroups,
//! cooperative matrices, head dimensions), and the cooperative-matrix layout probe that the
//! register softmax of the matrix kernels depends on. The decode's choice is in `decode_choice`.

use kpc::BackendKind;
use kpc::Context;
use kpc::DeviceInfo;
use kpc::Result;
use kpc::SpecConstants;

use super::{AttentionOptions, AttentionShape, KvDtype, PrefillKernel, shipped_kernel};

/// Shared memory the cooperative-matrix prefill kernel declares for head dimension `d`, `subgroups`
/// subgroups and `keys` keys per tile. With the softmax in shared memory: a 32-key tile of K and of
/// V (rows padded by 8 halves) and a 16 x 36 f32 score block per subgroup. With it in registers
/// (`quad`): a `keys`-key tile of K and of V, which the score blocks reuse to stage the output.
/// Either way Q is staged first, 16 rows per subgroup at a time, in the same space; with `q_shared`
/// (register softmax, two row blocks) the second block's Q stays beside the K/V tile; else with
/// `double` (register softmax) the K/V tile has two buffers.
pub(super) const fn coop_prefill_shared(
    d: usize,
    subgroups: usize,
    quad: bool,
    keys: usize,
    q_shared: bool,
    double: bool,
) -> usize {
    let row = (d / 8 + 1) * 16;
    let blocks = subgroups * 16 * 9 * 16;
    let q = subgroups * 16 * row;
    let most = if quad {
        let tile = if q_shared {
            2 * keys * row + q
        } else if double {
            4 * keys * row
        } else {
            2 * keys * row
        };
        if tile > blocks { tile } else { blocks }
    } else {
        2 * 32 * row + blocks
    };
    if q > most { q } else { most }
}

/// Whether invocation `l`'s element `e` is row `(l >> 2) + 8 * (e >> 2)`, column
/// `2 * (l & 3) + (e & 1) + 8 * ((e >> 1) & 1)` in both the A matrix and the accumulator that the
/// `coop_layout` probe wrote (`probe`, its output; see kernels/coop_layout.comp): the layout in
/// which `attn_prefill_coop` keeps its softmax in registers.
fn quad_layout(probe: &[u32]) -> bool {
    probe.len() >= 1026
        && probe[1024] == 8
        && probe[1025] == 8
        && (0..2).all(|m| {
            (0..32).all(|l| {
                (0..8).all(|e| {
                    let row = (l >> 2) + 8 * (e >> 2);
                    let col = 2 * (l & 3) + (e & 1) + 8 * ((e >> 1) & 1);
                    probe[m * 512 + l * 16 + e] == (row * 16 + col) as u32
                })
            })
        })
}

/// The layout probe's verdicts by device fingerprint: the layout belongs to the device and driver,
/// so one probe per process serves every [`Attention`] built on them (a model builds one per layer).
static QUAD_LAYOUT: std::sync::LazyLock<dashmap::DashMap<[u8; 32], bool>> =
    std::sync::LazyLock::new(dashmap::DashMap::new);

/// Whether `ctx`'s device's cooperative matrices have the layout [`quad_layout`] checks: the
/// `coop_layout` probe's verdict, run on the first call for a device and remembered. Only for
/// devices with cooperative matrices and subgroups of 32 (the prefill's own conditions).
pub(super) fn coop_quad_layout(ctx: &Context) -> Result<bool> {
    let key = ctx.device().fingerprint.digest.0;
    if let Some(quad) = QUAD_LAYOUT.get(&key) {
        return Ok(*quad);
    }
    let quad = probe_quad_layout(ctx)?;
    QUAD_LAYOUT.insert(key, quad);
    Ok(quad)
}

/// Runs the `coop_layout` probe on `ctx`'s device: see [`coop_quad_layout`].
fn probe_quad_layout(ctx: &Context) -> Result<bool> {
    let kernel = shipped_kernel(ctx, "coop_layout", &SpecConstants::new())?;
    let out = ctx.buffer::<u32>(1026)?;
    let probe = kpc::LaunchDesc {
        kernel: &kernel,
        groups: [1, 1, 1],
        buffers: &[&out],
        push_constants: &[],
    };
    super::launch::submit(&ctx.queue(), &[probe])?.wait()?;
    let probe = out.read()?;
    let quad = quad_layout(&probe);
    if !quad {
        // Row * 16 + column of invocations 0 to 3, A then accumulator: enough to see the layout.
        let head = |m: usize| -> Vec<u32> {
            (0..4)
                .flat_map(|l| probe[m * 512 + l * 16..][..8].to_vec())
                .collect()
        };
        tracing::debug!(
            "cooperative matrices are not in the quad layout (counts {} and {}; A {:?}, \
             accumulator {:?}): the cooperative-matrix prefill keeps its softmax in shared memory",
            probe[1024],
            probe[1025],
            head(0),
            head(1)
        );
    }
    Ok(quad)
}

/// Why `device` cannot run kpc's cooperative-matrix kernels (16x16 fp16 matrices accumulating in
/// fp32, subgroups of 32), if it cannot.
pub(crate) fn coop_matrix_unfit(device: &DeviceInfo) -> Option<String> {
    let l = &device.limits;
    if device.backend != BackendKind::Vulkan || !l.cooperative_matrix_f16 {
        return Some(
            "the device has no 16x16 fp16 cooperative matrices with fp32 accumulation \
             (VK_KHR_cooperative_matrix)"
                .into(),
        );
    }
    if l.subgroup_size != Some(32) {
        return Some(format!(
            "it needs subgroups of 32; the device's are {:?}",
            l.subgroup_size
        ));
    }
    None
}

/// What every fp16 matrix kernel (the KHR and cm2 prefills, the matrix decode) needs: the device's
/// matrices ([`coop_matrix_unfit`]), fp16 K/V, and a head dimension that is a multiple of
/// `multiple` up to 128; the error says which is missing (`hint` is added to the head dimension's).
pub(super) fn fp16_matrix_fits(
    device: &DeviceInfo,
    dtype: KvDtype,
    head_dim: usize,
    multiple: usize,
    hint: &str,
) -> std::result::Result<(), String> {
    if let Some(why) = coop_matrix_unfit(device) {
        return Err(why);
    }
    if dtype != KvDtype::F16 {
        return Err("it needs fp16 K/V".into());
    }
    if head_dim % multiple != 0 || head_dim > 128 {
        return Err(format!(
            "head dimension {head_dim} is not a multiple of {multiple} up to 128{hint}"
        ));
    }
    Ok(())
}

/// Subgroups of the cooperative-matrix prefill's workgroups for `options`: `coop_rows` over
/// 16 rows times `coop_row_blocks`.
pub(super) fn coop_prefill_subgroups(options: &AttentionOptions) -> u32 {
    options.coop_rows / (16 * options.coop_row_blocks.max(1))
}

/// Whether the cooperative-matrix prefill kernel runs on `device` for `shape` and `dtype` with the
/// tile that `options` sets (`coop_rows`, `coop_row_blocks`, `coop_keys`); the error says why not.
pub(super) fn coop_prefill_fits(
    device: &DeviceInfo,
    shape: &AttentionShape,
    dtype: KvDtype,
    options: &AttentionOptions,
) -> std::result::Result<(), String> {
    let l = &device.limits;
    let (rows, blocks, keys) = (
        options.coop_rows,
        options.coop_row_blocks,
        options.coop_keys,
    );
    if blocks != 1 && blocks != 2 {
        return Err(format!(
            "coop_row_blocks {blocks} is not 1 or 2 (16-row blocks per subgroup)"
        ));
    }
    if keys != 32 && keys != 64 {
        return Err(format!("coop_keys {keys} is not 32 or 64 (keys per tile)"));
    }
    let subgroups = coop_prefill_subgroups(options);
    if rows % (16 * blocks) != 0 || (subgroups != 4 && subgroups != 8) {
        return Err(format!(
            "coop_rows {rows} is not 4 or 8 subgroups of {} rows (coop_row_blocks {blocks}): \
             64 or 128 rows with 1 block, 128 or 256 with 2",
            16 * blocks
        ));
    }
    let subgroups = subgroups as usize;
    // Each invocation stages whole 16-byte pieces of a 32-key tile.
    let hint = format!(" (with {subgroups} subgroups)");
    fp16_matrix_fits(device, dtype, shape.head_dim, 8 * subgroups, &hint)?;
    let invocations = 32 * subgroups as u32;
    if l.max_workgroup_invocations < invocations {
        return Err(format!(
            "it needs workgroups of {invocations} invocations; the device allows {}",
            l.max_workgroup_invocations
        ));
    }
    // Either softmax (the probe that picks one runs later, in Attention::new).
    let q_shared = options.coop_q_shared && blocks == 2;
    let need = coop_prefill_shared(
        shape.head_dim,
        subgroups,
        false,
        keys as usize,
        false,
        false,
    )
    .max(coop_prefill_shared(
        shape.head_dim,
        subgroups,
        true,
        keys as usize,
        q_shared,
        options.coop_double,
    ));
    if (l.max_shared_memory_bytes as usize) < need {
        return Err(format!(
            "it needs {need} bytes of shared memory; the device has {}",
            l.max_shared_memory_bytes
        ));
    }
    Ok(())
}

/// Whether the VK_NV_cooperative_matrix2 prefill kernel runs on `device` for `shape`, `dtype` and
/// the tile that `options` sets; the error says why not.
pub(super) fn cm2_prefill_fits(
    device: &DeviceInfo,
    shape: &AttentionShape,
    dtype: KvDtype,
    options: &AttentionOptions,
) -> std::result::Result<(), String> {
    let l = &device.limits;
    if let Some(why) = coop_matrix_unfit(device) {
        return Err(why);
    }
    if l.cooperative_matrix2_workgroup == 0 {
        return Err(
            "the device has no workgroup-scope matrices with reductions, conversions, \
                    per-element operations and tensor addressing (VK_NV_cooperative_matrix2)"
                .into(),
        );
    }
    // Multiples of 32: the head dimensions run on a device with the extension (64, 96, 128).
    fp16_matrix_fits(device, dtype, shape.head_dim, 32, "")?;
    let tile = |n: u32| n % 16 == 0 && (16..=256).contains(&n);
    if !tile(options.cm2_rows) || !tile(options.cm2_keys) {
        return Err(format!(
            "cm2_rows {} and cm2_keys {} must be multiples of 16 from 16 to 256",
            options.cm2_rows, options.cm2_keys
        ));
    }
    let local = options.cm2_local_size;
    let most = l
        .cooperative_matrix2_workgroup
        .min(l.max_workgroup_invocations);
    if !local.is_power_of_two() || local < 32 || local > most {
        return Err(format!(
            "cm2_local_size {local} is not a power of two from 32 to {most} (the device's largest \
             workgroup for workgroup-scope matrices)"
        ));
    }
    Ok(())
}

/// The prefill kernel [`PrefillKernel::Auto`] resolves to on `device` for `shape` and `dtype`: the
/// KHR cooperative-matrix kernel (the tile `options` sets) where it fits, else the
/// VK_NV_cooperative_matrix2 one where that fits, else the tiled one, else the generic one.
///
/// The KHR kernel comes first because it was the faster of the two on both devices measured with
/// both (H100, driver 580.159.04: 162/191/207 against cm2's best 126/157/175 TFLOP/s at L =
/// 2k/4k/8k; H200, same driver, with two 16-row blocks per subgroup: 174/209/232 against 126/157/169;
/// BENCHMARKS.md); the cm2 kernel then runs where the KHR one does not fit (too little shared
/// memory) or when asked for.
pub(super) fn auto_prefill(
    device: &DeviceInfo,
    shape: &AttentionShape,
    dtype: KvDtype,
    options: &AttentionOptions,
) -> PrefillKernel {
    if coop_prefill_fits(device, shape, dtype, options).is_ok() {
        PrefillKernel::Cooperative
    } else if cm2_prefill_fits(device, shape, dtype, options).is_ok() {
        PrefillKernel::Cm2
    } else if tiled_prefill_fits(device, shape).is_ok() {
        PrefillKernel::Tiled
    } else {
        PrefillKernel::Generic
    }
}

/// Shared memory the tiled prefill kernel declares with a head-dimension slice of `slice`.
pub(super) const fn tiled_prefill_shared(slice: usize) -> usize {
    slice * 784 + 16384
}

/// The head-dimension slice the tiled prefill stages per step on `device`: 32 where the shared
/// memory allows (half the barriers), else 16.
pub(super) fn tiled_prefill_slice(device: &DeviceInfo) -> u32 {
    if device.limits.max_shared_memory_bytes as usize >= tiled_prefill_shared(32) {
        32
    } else {
        16
    }
}

/// Whether the tiled prefill kernel runs on `device` for `shape`; the error says why not.
pub(super) fn tiled_prefill_fits(
    device: &DeviceInfo,
    shape: &AttentionShape,
) -> std::result::Result<(), String> {
    if shape.head_dim % 64 != 0 || shape.head_dim > 256 {
        return Err(format!(
            "head dimension {} is not a multiple of 64 up to 256",
            shape.head_dim
        ));
    }
    if device.limits.max_workgroup_invocations < 256 {
        return Err(format!(
            "it needs workgroups of 256 invocations; the device allows {}",
            device.limits.max_workgroup_invocations
        ));
    }
    let need = tiled_prefill_shared(16);
    if (device.limits.max_shared_memory_bytes as usize) < need {
        return Err(format!(
            "it needs {need} bytes of shared memory; the device has {}",
            device.limits.max_shared_memory_bytes
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::{
        AttentionOptions, AttentionShape, DeviceInfo, KvDtype, PrefillKernel, auto_prefill,
        cm2_prefill_fits, quad_layout,
    };
    use kpc::BackendKind;
    use kpc::DeviceType;
    use kpc::admin::backend::DeviceFingerprint;

    /// A device as discovery would describe one: lavapipe-like (no matrices), KHR matrices only, or
    /// KHR and NV cooperative matrix 2 (H100-like: workgroup-scope matrices up to 256 invocations).
    pub(crate) fn device(khr: bool, cm2: u32) -> DeviceInfo {
        let mut d = DeviceInfo::new(
            BackendKind::Vulkan,
            0,
            "test",
            DeviceFingerprint::new(BackendKind::Vulkan, vec![]),
        );
        d.device_type = DeviceType::DiscreteGpu;
        d.driver = "test".into();
        d.api_version = "1.3".into();
        let l = &mut d.limits;
        l.max_workgroup_invocations = 1024;
        l.max_shared_memory_bytes = 49152;
        l.subgroup_size = Some(32);
        l.storage_16bit = true;
        l.float16_arithmetic = true;
        l.cooperative_matrix_f16 = khr;
        l.cooperative_matrix2_workgroup = cm2;
        d
    }

    #[test]
    fn cm2_prefill_only_where_the_device_has_workgroup_scope_matrices() {
        let s = AttentionShape {
            batch: 1,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
        };
        let o = AttentionOptions::default();
        let f16 = KvDtype::F16;
        let lavapipe = cm2_prefill_fits(&device(false, 0), &s, f16, &o).unwrap_err();
        assert!(lavapipe.contains("VK_KHR_cooperative_matrix"), "{lavapipe}");
        let khr = cm2_prefill_fits(&device(true, 0), &s, f16, &o).unwrap_err();
        assert!(khr.contains("VK_NV_cooperative_matrix2"), "{khr}");
        let h100 = device(true, 256);
        assert_eq!(cm2_prefill_fits(&h100, &s, f16, &o), Ok(()));
        assert!(
            cm2_prefill_fits(&h100, &s, KvDtype::F32, &o)
                .unwrap_err()
                .contains("fp16")
        );
        let d80 = AttentionShape { head_dim: 80, ..s };
        assert!(cm2_prefill_fits(&h100, &d80, f16, &o).is_err());
        let d96 = AttentionShape { head_dim: 96, ..s };
        assert_eq!(cm2_prefill_fits(&h100, &d96, f16, &o), Ok(()));
        let d256 = AttentionShape { head_dim: 256, ..s };
        assert!(cm2_prefill_fits(&h100, &d256, f16, &o).is_err());
        for bad in [
            AttentionOptions { cm2_rows: 40, ..o },
            AttentionOptions { cm2_keys: 0, ..o },
            AttentionOptions { cm2_keys: 512, ..o },
            AttentionOptions {
                cm2_local_size: 96,
                ..o
            },
            AttentionOptions {
                cm2_local_size: 512,
                ..o
            },
        ] {
            assert!(cm2_prefill_fits(&h100, &s, f16, &bad).is_err(), "{bad:?}");
        }
        let wide = AttentionOptions {
            cm2_rows: 128,
            cm2_local_size: 256,
            ..o
        };
        assert_eq!(cm2_prefill_fits(&h100, &s, f16, &wide), Ok(()));
        assert!(cm2_prefill_fits(&device(true, 128), &s, f16, &wide).is_err());
    }

    #[test]
    fn auto_prefill_prefers_khr_matrices_then_cm2_then_tiled() {
        let s = AttentionShape {
            batch: 4,
            q_heads: 32,
            kv_heads: 32,
            head_dim: 128,
        };
        let o = AttentionOptions::default();
        let pick = |d: &DeviceInfo, dtype| auto_prefill(d, &s, dtype, &o);
        // lavapipe (CI): neither extension, so the existing kernels.
        assert_eq!(pick(&device(false, 0), KvDtype::F16), PrefillKernel::Tiled);
        assert_eq!(
            pick(&device(true, 0), KvDtype::F16),
            PrefillKernel::Cooperative
        );
        // Both: the KHR kernel, measured faster (see auto_prefill).
        assert_eq!(
            pick(&device(true, 256), KvDtype::F16),
            PrefillKernel::Cooperative
        );
        // f32 K/V: neither matrix kernel.
        assert_eq!(pick(&device(true, 256), KvDtype::F32), PrefillKernel::Tiled);
        // Too little shared memory for the KHR kernel (with 8 subgroups of 16 rows, which need
        // 35 KiB; the default 4 subgroups of 32 rows need 26 KiB, less than the tiled kernel's
        // 28.25): cm2 (which declares none) on a device that has it, the tiled kernel on one
        // that does not.
        let o = AttentionOptions {
            coop_row_blocks: 1,
            ..o
        };
        let mut small = device(true, 256);
        small.limits.max_shared_memory_bytes = 32768;
        assert_eq!(
            auto_prefill(&small, &s, KvDtype::F16, &o),
            PrefillKernel::Cm2
        );
        // A cm2 tile the device cannot take falls back rather than failing.
        let big = AttentionOptions {
            cm2_local_size: 512,
            ..o
        };
        assert_eq!(
            auto_prefill(&small, &s, KvDtype::F16, &big),
            PrefillKernel::Tiled
        );
        small.limits.cooperative_matrix2_workgroup = 0;
        assert_eq!(
            auto_prefill(&small, &s, KvDtype::F16, &o),
            PrefillKernel::Tiled
        );
    }

    /// A probe output for the layout `at(invocation, element) -> (row, column)`, counts 8.
    fn probe(at: impl Fn(usize, usize) -> (usize, usize)) -> Vec<u32> {
        let mut o = vec![u32::MAX; 1026];
        for m in 0..2 {
            for l in 0..32 {
                for e in 0..8 {
                    let (r, c) = at(l, e);
                    o[m * 512 + l * 16 + e] = (r * 16 + c) as u32;
                }
            }
        }
        o[1024] = 8;
        o[1025] = 8;
        o
    }

    fn quad(l: usize, e: usize) -> (usize, usize) {
        (
            (l >> 2) + 8 * (e >> 2),
            2 * (l & 3) + (e & 1) + 8 * ((e >> 1) & 1),
        )
    }

    #[test]
    fn quad_layout_accepts_only_that_layout() {
        assert!(quad_layout(&probe(quad)));
        // Transposed, row-major by invocation, or with other counts: the shared-memory softmax.
        assert!(!quad_layout(&probe(|l, e| {
            let (r, c) = quad(l, e);
            (c, r)
        })));
        assert!(!quad_layout(&probe(|l, e| (l / 2, 8 * (l % 2) + e))));
        // Bits 1 and 2 of the element index swapped (the layout first assumed, before the probe
        // ran on an H200).
        assert!(!quad_layout(&probe(|l, e| {
            (
                (l >> 2) + 8 * ((e >> 1) & 1),
                2 * (l & 3) + (e & 1) + 8 * (e >> 2),
            )
        })));
        let mut counts = probe(quad);
        counts[1025] = 16;
        assert!(!quad_layout(&counts));
        // A and the accumulator disagreeing in one element.
        let mut one = probe(quad);
        one[512 + 5 * 16 + 3] += 1;
        assert!(!quad_layout(&one));
        assert!(!quad_layout(&probe(quad)[..1000]));
    }
}
