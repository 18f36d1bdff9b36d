//! Which decode kernel runs on which device: the vectorized kernel's layout (lanes per row, how a
//! row's lanes are summed) and what the cooperative-matrix decode needs.

use kpc::DeviceInfo;
use kpc::{BackendKind, Context};
use kpc::{Error, Result};

use super::choice::{coop_matrix_unfit, coop_quad_layout, fp16_matrix_fits};
use super::{Attention, AttentionOptions, AttentionShape, DecodeKernel, KvDtype};

/// Most query heads per KV head the vectorized decode kernel serves in one workgroup.
const VEC_MAX_GROUP: usize = 8;
/// Most head elements one lane of the vectorized decode kernel holds (`MAX_VALS` in the kernel).
const VEC_MAX_VALS: usize = 32;

/// How the vectorized decode kernel is laid out on one device for one shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct VecLayout {
    /// Invocations per K/V row.
    pub(super) lanes: u32,
    /// OpenCL on NVIDIA: sum a row's lanes with the PTX warp shuffle instead of local memory.
    pub(super) nv_shuffle: bool,
    /// Vulkan: 8-byte chunks per lane (the kernel's `NARROW`) instead of 16.
    pub(super) narrow: bool,
    /// Vulkan: the row groups of all query heads merged at once (the kernel's `MERGE_ALL`); set
    /// by [`with_merge_all`] where asked for and where its shared memory fits.
    pub(super) merge_all: bool,
}

/// Shared memory of the vectorized decode on Vulkan for `layout`, `group` query heads per KV head,
/// head dimension `d` and `local_size` invocations: its row-merge buffers (a max and a sum per row
/// group, for every head with `merge_all` or `merge_once`; a row per row group, for every head with
/// `merge_all`), the combination's 1024 weights, its per-slice rows, two reduction arrays and a
/// flag.
pub(super) fn vec_decode_shared(
    layout: VecLayout,
    group: usize,
    d: usize,
    local_size: u32,
    merge_once: bool,
) -> usize {
    let rg = (local_size / layout.lanes) as usize;
    let local = local_size as usize;
    let rows = if layout.merge_all { group } else { 1 };
    let pairs = if layout.merge_all || merge_once {
        group
    } else {
        1
    };
    4 * (pairs * rg * 2 + rows * rg * d + 1024 + 2 * local + local / 32 * d) + 4
}

/// `layout` with the row groups of all query heads merged at once where `asked`, on Vulkan, and
/// where the kernel's shared memory then fits the device.
pub(super) fn with_merge_all(
    layout: VecLayout,
    device: &DeviceInfo,
    shape: &AttentionShape,
    local_size: u32,
    asked: bool,
) -> VecLayout {
    let merged = VecLayout {
        merge_all: true,
        ..layout
    };
    let fits = vec_decode_shared(
        merged,
        shape.q_heads / shape.kv_heads,
        shape.head_dim,
        local_size,
        true,
    ) <= device.limits.max_shared_memory_bytes as usize;
    if asked && device.backend == BackendKind::Vulkan && fits {
        merged
    } else {
        layout
    }
}

/// Whether the vectorized decode kernel runs on `device` for `shape` and `dtype`, and how; the error
/// says why not. With `narrow` (Vulkan only; ignored on OpenCL) a lane loads 8-byte chunks and a
/// row may take up to 32 lanes.
pub(super) fn vec_layout(
    device: &DeviceInfo,
    shape: &AttentionShape,
    dtype: KvDtype,
    local_size: u32,
    narrow: bool,
) -> std::result::Result<VecLayout, String> {
    let narrow = narrow && device.backend == BackendKind::Vulkan;
    let elems = if narrow { 8 } else { 16 } / dtype.bytes();
    if shape.head_dim % elems != 0 {
        return Err(format!(
            "head dimension {} is not a multiple of {elems} ({dtype:?} elements per {}-byte load)",
            shape.head_dim,
            elems * dtype.bytes()
        ));
    }
    let group = shape.q_heads / shape.kv_heads;
    if group > VEC_MAX_GROUP {
        return Err(format!(
            "{group} query heads per KV head; the vectorized kernel serves at most {VEC_MAX_GROUP}"
        ));
    }
    if local_size > device.limits.max_workgroup_invocations {
        return Err(format!(
            "it needs workgroups of {local_size} invocations; the device allows {}",
            device.limits.max_workgroup_invocations
        ));
    }
    let (most, nv_shuffle) = match device.backend {
        BackendKind::Vulkan => {
            if !device.limits.subgroup_shuffle {
                return Err("the device has no subgroup shuffles in compute shaders".into());
            }
            let sg = device
                .limits
                .subgroup_size
                .ok_or("the device reports no subgroup size")?;
            (sg.min(if narrow { 32 } else { 16 }), false)
        }
        BackendKind::OpenCl => (16, device.driver.contains("NVIDIA")),
    };
    let chunks = (shape.head_dim / elems) as u32;
    let mut lanes = 1;
    while lanes * 2 <= most && chunks % (lanes * 2) == 0 && local_size % (lanes * 2) == 0 {
        lanes *= 2;
    }
    let vals = shape.head_dim / lanes as usize;
    if vals > VEC_MAX_VALS {
        return Err(format!(
            "{lanes} lanes per row leave {vals} elements per lane; the kernel holds at most \
             {VEC_MAX_VALS}"
        ));
    }
    Ok(VecLayout {
        lanes,
        nv_shuffle,
        narrow,
        merge_all: false,
    })
}

/// Shared memory the cooperative-matrix decode declares for head dimension `d` and `local_size`
/// invocations: one array for the largest of its phases (the subgroups' 16-row V tiles padded by 8
/// halves, their output rows when they merge, the combination's 1024 maxima and sums and its
/// per-slice rows), a max and sum for 8 rows per subgroup, the appended V row and a flag.
pub(super) const fn coop_decode_shared(d: usize, local_size: usize) -> usize {
    let subgroups = local_size / 32;
    let tiles = subgroups * 16 * (d / 8 + 1);
    let merge = subgroups * 2 * d;
    let combine = 2 * 256 + subgroups * d / 4;
    let most = if tiles > merge { tiles } else { merge };
    let most = if most > combine { most } else { combine };
    16 * most + 4 * 16 * subgroups + 16 * 16 + 4
}

/// Whether the cooperative-matrix decode runs on `device` for `shape`, `dtype`, `options` and a
/// launch of up to `most_splits` splits (where it does, so does [`vec_layout`]), given whether the
/// device's matrices have the register layout the kernel assumes (`quad`, the `coop_layout`
/// probe's verdict); the error says why not.
pub(super) fn coop_decode_fits(
    device: &DeviceInfo,
    shape: &AttentionShape,
    dtype: KvDtype,
    options: &AttentionOptions,
    most_splits: usize,
    quad: bool,
) -> std::result::Result<(), String> {
    fp16_matrix_fits(device, dtype, shape.head_dim, 16, "")?;
    if !quad {
        return Err(
            "the device's cooperative matrices do not hold their elements in the layout the \
             kernel assumes (the coop_layout probe)"
                .into(),
        );
    }
    // It runs in the vectorized kernel's launch (grid, scratch, push constants), which needs
    // that kernel's layout: subgroup shuffles, at most 8 query heads per KV head, the local size.
    vec_layout(device, shape, dtype, options.decode_local_size, false)
        .map_err(|why| format!("it runs in the vectorized kernel's launch, and {why}"))?;
    let group = shape.q_heads / shape.kv_heads;
    if group * most_splits > 1024 {
        return Err(format!(
            "{group} query heads times {most_splits} splits exceed the 1024 (max, sum) pairs its \
             combination holds"
        ));
    }
    if options.decode_spread {
        return Err("decode_spread (a workgroup per query head) is the vectorized kernel's".into());
    }
    let local = options.decode_local_size;
    if local != 64 && local != 128 {
        return Err(format!(
            "decode_local_size {local} is not 64 or 128 (2 or 4 subgroups)"
        ));
    }
    let need = coop_decode_shared(shape.head_dim, local as usize);
    if need > device.limits.max_shared_memory_bytes as usize {
        return Err(format!(
            "with {local} invocations it needs {need} bytes of shared memory; the device has {}",
            device.limits.max_shared_memory_bytes
        ));
    }
    Ok(())
}

/// The decode variant's choice for an [`Attention`] being made (layer.rs): whether the
/// cooperative-matrix decode runs, and which of the vectorized kernel's constants fit.
impl Attention {
    /// Whether the decode runs on the matrix units: only where asked for
    /// ([`DecodeKernel::Cooperative`]), and then it must fit (see [`coop_decode_fits`]). Runs the
    /// `coop_layout` probe (once per device) only on devices with cooperative matrices.
    ///
    /// Errors: [`Error::InvalidArgument`] when it is asked for and cannot run (the message says
    /// why); the probe's errors.
    pub(super) fn choose_coop_decode(
        ctx: &Context,
        shape: &AttentionShape,
        dtype: KvDtype,
        capacity: usize,
        options: &AttentionOptions,
    ) -> Result<bool> {
        // Never chosen by itself: on the H100 it was slower than the vectorized kernel at every
        // shape measured (BENCHMARKS.md).
        if options.decode != DecodeKernel::Cooperative {
            return Ok(false);
        }
        let device = ctx.device();
        let quad = coop_matrix_unfit(device).is_none() && coop_quad_layout(ctx)?;
        let most = Self::vec_most_splits(shape, *options, capacity);
        match coop_decode_fits(device, shape, dtype, options, most, quad) {
            Ok(()) => Ok(true),
            Err(why) => Err(Error::InvalidArgument(format!(
                "the cooperative-matrix decode kernel cannot run here: {why}"
            ))),
        }
    }

    /// Whether the vectorized decode's all-heads combination fits (its `COMBINE` constant): every
    /// split's max and sum of a KV head's query heads, at the most splits this attention uses,
    /// must fit the kernel's 1024 cached weights and its row-merge buffer (row groups × D).
    pub(super) fn combine_all_fits(
        shape: &AttentionShape,
        options: AttentionOptions,
        capacity: usize,
        lanes: u32,
    ) -> bool {
        let most = Self::vec_most_splits(shape, options, capacity);
        let entries = shape.q_heads / shape.kv_heads * most;
        let row_groups = (options.decode_local_size / lanes) as usize;
        entries <= 1024 && entries <= row_groups * shape.head_dim
    }

    /// Whether the vectorized decode shares a row's query heads out among its lanes (its
    /// `HEAD_LANES` constant): asked for ([`AttentionOptions::decode_head_lanes`]), on Vulkan, one
    /// workgroup serving every query head of a KV head, and a group that is a power of two from 2
    /// to the lanes per row.
    pub(super) fn head_lanes_fit(
        backend: BackendKind,
        shape: &AttentionShape,
        options: AttentionOptions,
        lanes: u32,
    ) -> bool {
        let group = (shape.q_heads / shape.kv_heads) as u32;
        options.decode_head_lanes
            && backend == BackendKind::Vulkan
            && !options.decode_spread
            && group >= 2
            && group.is_power_of_two()
            && group <= lanes
    }

    /// Whether the all-heads combination reduces each head's split maxima and sums in parallel
    /// (the kernel's `SCAN`): asked for ([`AttentionOptions::decode_scan`]) and a group that is a
    /// power of two, so that each head's invocations form whole clusters of lanes.
    pub(super) fn scan_fits(shape: &AttentionShape, options: AttentionOptions) -> bool {
        options.decode_scan && (shape.q_heads / shape.kv_heads).is_power_of_two()
    }
}

#[cfg(test)]
mod tests {
    use super::{AttentionOptions, AttentionShape, KvDtype, coop_decode_fits, coop_decode_shared};
    use crate::choice::tests::device;

    #[test]
    fn coop_decode_needs_matrices_their_layout_fp16_and_room() {
        let s = AttentionShape {
            batch: 1,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
        };
        let o = AttentionOptions::default();
        let mut h100 = device(true, 256);
        h100.limits.subgroup_shuffle = true;
        assert_eq!(
            coop_decode_fits(&h100, &s, KvDtype::F16, &o, 64, true),
            Ok(())
        );
        let lavapipe =
            coop_decode_fits(&device(false, 0), &s, KvDtype::F16, &o, 64, true).unwrap_err();
        assert!(lavapipe.contains("VK_KHR_cooperative_matrix"), "{lavapipe}");
        assert!(
            coop_decode_fits(&h100, &s, KvDtype::F16, &o, 64, false)
                .unwrap_err()
                .contains("layout")
        );
        assert!(
            coop_decode_fits(&h100, &s, KvDtype::F32, &o, 64, true)
                .unwrap_err()
                .contains("fp16")
        );
        for d in [72, 136, 256] {
            let bad = AttentionShape { head_dim: d, ..s };
            assert!(
                coop_decode_fits(&h100, &bad, KvDtype::F16, &o, 64, true).is_err(),
                "{d}"
            );
        }
        let wide = AttentionShape { q_heads: 128, ..s };
        assert!(
            coop_decode_fits(&h100, &wide, KvDtype::F16, &o, 64, true)
                .unwrap_err()
                .contains("at most 8")
        );
        // 4 query heads by 257 splits no longer fit the combination's 1024 pairs.
        assert_eq!(
            coop_decode_fits(&h100, &s, KvDtype::F16, &o, 256, true),
            Ok(())
        );
        assert!(
            coop_decode_fits(&h100, &s, KvDtype::F16, &o, 257, true)
                .unwrap_err()
                .contains("1024")
        );
        let mut small = h100.clone();
        small.limits.max_shared_memory_bytes = 16384;
        assert!(
            coop_decode_fits(&small, &s, KvDtype::F16, &o, 64, true)
                .unwrap_err()
                .contains("shared memory")
        );
        let local64 = AttentionOptions {
            decode_local_size: 64,
            ..o
        };
        assert_eq!(
            coop_decode_fits(&h100, &s, KvDtype::F16, &local64, 64, true),
            Ok(())
        );
        for bad in [
            AttentionOptions {
                decode_local_size: 32,
                ..o
            },
            AttentionOptions {
                decode_local_size: 256,
                ..o
            },
            AttentionOptions {
                decode_spread: true,
                ..o
            },
        ] {
            assert!(
                coop_decode_fits(&h100, &s, KvDtype::F16, &bad, 64, true).is_err(),
                "{bad:?}"
            );
        }
        // 4 subgroups' V tiles (4 * 16 rows of 17 uvec4s) are the largest phase at D = 128.
        assert_eq!(coop_decode_shared(128, 128), 16 * 1088 + 256 + 256 + 4);
    }
}
