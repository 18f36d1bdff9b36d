//! Attention with a KV cache, kpc's built-in workload, on either backend.
//!
//! - [`KvCache`] holds one layer's K and V on the device, preallocated to a capacity and laid out
//!   `[batch][kv_head][position][head_dim]`, so that a decode step reads each head's past as one
//!   contiguous run. Appending a token writes one position per (batch, KV head) in place: O(1), the
//!   past is never copied.
//! - [`Attention`] holds the kernels for one shape (acquired through the context's caches, one
//!   distinct cached program per variant) and runs them: [`Attention::prefill`] appends a prompt's
//!   K and V and runs causal attention over it (tiled, online softmax, fully masked tiles skipped);
//!   [`Attention::decode`] appends a token's K/V row from device buffers and attends over every
//!   position, as one submission ([`Attention::decode_step`] takes the row from the host);
//!   [`Attention::attend`] attends over a cache without appending (a static cross-attention set
//!   filled once with [`KvCache::fill`]).
//! - Decode is flash-decoding: the sequence is split into chunks, each attended by its own
//!   workgroups, and the chunks are combined with a log-sum-exp. Kernels are chosen per device and
//!   shape ([`DecodeKernel`], [`PrefillKernel`]): where the device allows, one fused launch
//!   (`attn_decode_vec`: append, 16-byte loads, subgroup sums, combination by the last workgroup);
//!   a prefill on the matrix units where the device has fp16 cooperative matrices
//!   (`attn_prefill_coop`, Vulkan, fp16 K/V; its softmax in registers where the `coop_layout`
//!   probe finds a layout it knows), else a register-tiled one (`attn_prefill_tiled`);
//!   elsewhere the generic kernels (`attn_append`, `attn_decode`, `attn_reduce`, `attn_prefill`).
//!   Each variant is its own cached program.
//! - [`reference`] is the float64 CPU reference the kernels are tested against.
//!
//! Q and O are f32, `[batch][q_head][head_dim]` per decode step. K and V are f32 or f16
//! ([`KvDtype`]); computation is f32, except that the cooperative-matrix prefill multiplies Q and
//! the softmax weights as fp16 (accumulating in f32). The scale is `1 / sqrt(head_dim)`.

pub mod reference;

use crate::backend::DeviceInfo;
use crate::cache::{BuildOptions, SpecConstants, SpecValue};
use crate::config::BackendKind;
use crate::error::{Error, Result};
use crate::runtime::{Buffer, BufferArg, Context, Event, Kernel, LaunchDesc, PushConstants};

/// The head layout of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Sequences processed together (B).
    pub batch: usize,
    /// Query heads (Hq).
    pub q_heads: usize,
    /// Key/value heads (Hkv); `q_heads` must be a multiple of it (grouped-query attention).
    pub kv_heads: usize,
    /// Elements per head (D): even, at most [`MAX_HEAD_DIM`].
    pub head_dim: usize,
}

/// The largest head dimension the kernels accept.
pub const MAX_HEAD_DIM: usize = 256;

impl AttentionShape {
    /// Checks that the kernels support this shape.
    ///
    /// Errors: [`Error::InvalidArgument`] for a zero dimension, `q_heads` not a multiple of
    /// `kv_heads`, or a head dimension that is odd or larger than [`MAX_HEAD_DIM`].
    pub fn validate(&self) -> Result<()> {
        let s = self;
        if s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.head_dim == 0 {
            return Err(Error::InvalidArgument(format!(
                "attention dimensions must be positive: {s:?}"
            )));
        }
        if s.q_heads % s.kv_heads != 0 {
            return Err(Error::InvalidArgument(format!(
                "query heads ({}) must be a multiple of key/value heads ({})",
                s.q_heads, s.kv_heads
            )));
        }
        if s.head_dim % 2 != 0 || s.head_dim > MAX_HEAD_DIM {
            return Err(Error::InvalidArgument(format!(
                "head dimension {} unsupported: it must be even and at most {MAX_HEAD_DIM}",
                s.head_dim
            )));
        }
        Ok(())
    }

    /// Elements of one decode step's Q or O: `batch * q_heads * head_dim`.
    pub fn q_elems(&self) -> usize {
        self.batch * self.q_heads * self.head_dim
    }

    /// Elements of one position of K or V over the batch: `batch * kv_heads * head_dim`.
    pub fn kv_step_elems(&self) -> usize {
        self.batch * self.kv_heads * self.head_dim
    }
}

/// How K and V are stored in a [`KvCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 32-bit floats.
    F32,
    /// IEEE half floats (converted on upload with round-to-nearest-even; computed in f32).
    F16,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

pub(crate) fn check_len(what: &str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::Size {
            what: what.to_string(),
            got: format!("{got} elements"),
            expected: format!("{expected} elements"),
        })
    }
}

enum KvStore {
    F32 { k: Buffer<f32>, v: Buffer<f32> },
    F16 { k: Buffer<u16>, v: Buffer<u16> },
}

/// One layer's K and V on the device: `[batch][kv_head][position][head_dim]`, `capacity` positions
/// per head, of which the first [`KvCache::len`] are filled.
pub struct KvCache {
    shape: AttentionShape,
    capacity: usize,
    len: usize,
    store: KvStore,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("shape", &self.shape)
            .field("capacity", &self.capacity)
            .field("len", &self.len)
            .field("dtype", &self.dtype())
            .finish()
    }
}

impl KvCache {
    /// An empty cache for `capacity` positions, allocated on `ctx`'s device.
    ///
    /// Errors: [`Error::InvalidArgument`] for an invalid shape or a zero capacity; the context's
    /// allocation errors.
    pub fn new(
        ctx: &Context,
        shape: &AttentionShape,
        capacity: usize,
        dtype: KvDtype,
    ) -> Result<KvCache> {
        shape.validate()?;
        if capacity == 0 {
            return Err(Error::InvalidArgument(
                "a KV cache needs a capacity of at least one position".into(),
            ));
        }
        let elems = shape.kv_step_elems() * capacity;
        if elems
            .checked_mul(dtype.bytes())
            .is_none_or(|b| b > u32::MAX as usize)
        {
            return Err(Error::InvalidArgument(format!(
                "a KV cache of {capacity} positions for {shape:?} exceeds 4 GiB per buffer"
            )));
        }
        let store = match dtype {
            KvDtype::F32 => KvStore::F32 {
                k: ctx.buffer(elems)?,
                v: ctx.buffer(elems)?,
            },
            KvDtype::F16 => KvStore::F16 {
                k: ctx.buffer(elems)?,
                v: ctx.buffer(elems)?,
            },
        };
        Ok(KvCache {
            shape: *shape,
            capacity,
            len: 0,
            store,
        })
    }

    /// The shape it was made for.
    pub fn shape(&self) -> &AttentionShape {
        &self.shape
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The storage type of K and V.
    pub fn dtype(&self) -> KvDtype {
        match self.store {
            KvStore::F32 { .. } => KvDtype::F32,
            KvStore::F16 { .. } => KvDtype::F16,
        }
    }

    /// [`Error::Size`] when the cache has no room for one more position.
    fn check_room(&self) -> Result<()> {
        if self.len >= self.capacity {
            return Err(Error::Size {
                what: "KV cache append".into(),
                got: format!("position {}", self.len),
                expected: format!("a position below the capacity {}", self.capacity),
            });
        }
        Ok(())
    }

    /// Forgets every position (the buffers are kept; nothing is written).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Forgets every position from `len` on (a rollback, as after rejected speculative tokens); a
    /// `len` at or past [`KvCache::len`] changes nothing. Nothing is written.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Writes `rows` positions starting at `pos`, overwriting or extending: `k` and `v` are
    /// `[batch][kv_head][rows][head_dim]`, and afterwards [`KvCache::len`] is at least `pos + rows`.
    /// Lets a long context be uploaded in pieces.
    ///
    /// Errors: [`Error::Size`] when `pos` is past [`KvCache::len`] (that would leave a gap), the rows
    /// do not fit in the capacity, or a slice has the wrong length (nothing is written then); the
    /// buffer's write errors.
    pub fn write(&mut self, pos: usize, rows: usize, k: &[f32], v: &[f32]) -> Result<()> {
        if pos > self.len || pos + rows > self.capacity {
            return Err(Error::Size {
                what: "KV cache write".into(),
                got: format!("{rows} positions at {pos}"),
                expected: format!(
                    "a start at most the length {} and an end at most the capacity {}",
                    self.len, self.capacity
                ),
            });
        }
        let n = self.shape.kv_step_elems() * rows;
        check_len("written k", k.len(), n)?;
        check_len("written v", v.len(), n)?;
        self.write_rows(pos, rows, k, v)?;
        self.len = self.len.max(pos + rows);
        Ok(())
    }

    /// The device buffers, K then V, as kernel arguments.
    pub fn buffers(&self) -> (&dyn BufferArg, &dyn BufferArg) {
        match &self.store {
            KvStore::F32 { k, v } => (k, v),
            KvStore::F16 { k, v } => (k, v),
        }
    }

    /// Writes `rows` positions starting at `pos` for every (batch, KV head); `k` and `v` are
    /// `[batch][kv_head][rows][head_dim]`. One write per (batch, KV head) of `rows` positions.
    fn write_rows(&self, pos: usize, rows: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let d = self.shape.head_dim;
        let run = rows * d;
        for bh in 0..self.shape.batch * self.shape.kv_heads {
            let at = (bh * self.capacity + pos) * d;
            let (ks, vs) = (&k[bh * run..][..run], &v[bh * run..][..run]);
            match &self.store {
                KvStore::F32 { k, v } => {
                    k.write_at(at, ks)?;
                    v.write_at(at, vs)?;
                }
                KvStore::F16 { k, v } => {
                    k.write_at(at, &to_f16_bits(ks))?;
                    v.write_at(at, &to_f16_bits(vs))?;
                }
            }
        }
        Ok(())
    }

    /// Appends one position: `k_new` and `v_new` are `[batch][kv_head][head_dim]`. Writes that
    /// position in place (O(1); the past is not touched) and increments [`KvCache::len`].
    ///
    /// Errors: [`Error::Size`] when a slice has the wrong length or the cache is full (nothing is
    /// written then); the buffer's write errors.
    pub fn append(&mut self, k_new: &[f32], v_new: &[f32]) -> Result<()> {
        let n = self.shape.kv_step_elems();
        check_len("appended k", k_new.len(), n)?;
        check_len("appended v", v_new.len(), n)?;
        self.check_room()?;
        self.write_rows(self.len, 1, k_new, v_new)?;
        self.len += 1;
        Ok(())
    }

    /// Replaces the contents with `len` positions: `k` and `v` are `[batch][kv_head][len][head_dim]`.
    /// Used for a prompt's K and V and for a static cross-attention set.
    ///
    /// Errors: [`Error::Size`] when `len` exceeds the capacity or a slice has the wrong length.
    pub fn fill(&mut self, k: &[f32], v: &[f32], len: usize) -> Result<()> {
        if len > self.capacity {
            return Err(Error::Size {
                what: "KV cache fill".into(),
                got: format!("{len} positions"),
                expected: format!("at most the capacity {}", self.capacity),
            });
        }
        let n = self.shape.kv_step_elems() * len;
        check_len("filled k", k.len(), n)?;
        check_len("filled v", v.len(), n)?;
        self.write_rows(0, len, k, v)?;
        self.len = len;
        Ok(())
    }
}

fn to_f16_bits(x: &[f32]) -> Vec<u16> {
    x.iter()
        .map(|&v| half::f16::from_f32(v).to_bits())
        .collect()
}

/// Rounds `x` to f16 and back: what an f16 cache holds for it.
pub fn round_to_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

/// Which split kernel a decode runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeKernel {
    /// The vectorized kernel where the device and shape allow it, else the generic one.
    #[default]
    Auto,
    /// `attn_decode`: one invocation per position for the scores, any even head dimension.
    Generic,
    /// `attn_decode_vec`: 16-byte loads, several lanes per row summed by subgroup shuffles (Vulkan;
    /// OpenCL on NVIDIA) or local memory (other OpenCL devices), one workgroup per KV head for
    /// grouped-query attention, online softmax in registers. Needs a head dimension that splits into
    /// 16-byte chunks (a multiple of 8 for f16, 4 for f32) and at most 8 query heads per KV head.
    Vectorized,
}

/// Which prefill kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillKernel {
    /// The cooperative-matrix kernel where the device, shape and K/V type allow it, else the tiled
    /// one where they allow that, else the generic one.
    #[default]
    Auto,
    /// `attn_prefill`: `block_q` by `block_k` tiles, one score per invocation, any even head
    /// dimension.
    Generic,
    /// `attn_prefill_tiled`: 64 query rows by 128 keys per tile, 256 invocations each holding a 4
    /// by 8 block of scores and a slice of the output in registers (f32 arithmetic). Needs a head
    /// dimension that is a multiple of 64 (at most 256), workgroups of 256 and 28.25 KiB of shared
    /// memory (40.5 KiB for its wider staging).
    Tiled,
    /// `attn_prefill_coop`: the products S = Q K^T and O += P V on the device's matrix units
    /// (Vulkan cooperative matrices, 16x16 fp16 into fp32), `coop_rows` query rows per workgroup
    /// (16 per 32-wide subgroup). Where a probe kernel finds the matrices' element layout that it
    /// knows (NVIDIA's), the softmax stays in registers and tiles are 64 keys
    /// ([`AttentionOptions::coop_registers`]); elsewhere it goes through shared memory with
    /// 32-key tiles. Needs a Vulkan device with
    /// [`DeviceLimits::cooperative_matrix_f16`](crate::backend::DeviceLimits), subgroups of 32,
    /// fp16 K/V, and a head dimension up to 128 that is a multiple of `coop_rows / 2` (32 or 64).
    /// Q and P are rounded to fp16 for the products; sums are fp32.
    Cooperative,
}

/// Shared memory the cooperative-matrix prefill kernel declares for head dimension `d` and
/// `subgroups` subgroups. With the softmax in shared memory: a 32-key tile of K and of V (rows
/// padded by 8 halves) and a 16 x 36 f32 score block per subgroup (the Q tile, staged first, fits
/// in the same space). With it in registers (`quad`): a 64-key tile of K and of V, which the score
/// blocks reuse to stage the output.
const fn coop_prefill_shared(d: usize, subgroups: usize, quad: bool) -> usize {
    let blocks = subgroups * 16 * 9 * 16;
    if quad {
        let tile = 2 * 64 * (d / 8 + 1) * 16;
        if tile > blocks { tile } else { blocks }
    } else {
        2 * 32 * (d / 8 + 1) * 16 + blocks
    }
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
fn coop_quad_layout(ctx: &Context) -> Result<bool> {
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
    ctx.queue()
        .launch(&kernel, [1, 1, 1], &[&out], &[])?
        .wait()?;
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

/// Whether the cooperative-matrix prefill kernel runs on `device` for `shape` and `dtype`; the
/// error says why not.
fn coop_prefill_fits(
    device: &DeviceInfo,
    shape: &AttentionShape,
    dtype: KvDtype,
    rows: u32,
) -> std::result::Result<(), String> {
    let l = &device.limits;
    if rows != 64 && rows != 128 {
        return Err(format!(
            "coop_rows {rows} is not one of 64 and 128 (query rows per workgroup)"
        ));
    }
    let subgroups = rows as usize / 16;
    if device.backend != BackendKind::Vulkan || !l.cooperative_matrix_f16 {
        return Err(
            "the device has no 16x16 fp16 cooperative matrices with fp32 accumulation \
             (VK_KHR_cooperative_matrix)"
                .into(),
        );
    }
    if l.subgroup_size != Some(32) {
        return Err(format!(
            "it needs subgroups of 32; the device's are {:?}",
            l.subgroup_size
        ));
    }
    if dtype != KvDtype::F16 {
        return Err("it needs fp16 K/V".into());
    }
    // Each invocation stages whole 16-byte pieces of a 32-key tile.
    let step = 8 * subgroups;
    if shape.head_dim % step != 0 || shape.head_dim > 128 {
        return Err(format!(
            "head dimension {} is not a multiple of {step} up to 128 (with coop_rows {rows})",
            shape.head_dim
        ));
    }
    if l.max_workgroup_invocations < 2 * rows {
        return Err(format!(
            "it needs workgroups of {} invocations; the device allows {}",
            2 * rows,
            l.max_workgroup_invocations
        ));
    }
    // Either softmax (the probe that picks one runs later, in Attention::new).
    let need = coop_prefill_shared(shape.head_dim, subgroups, false).max(coop_prefill_shared(
        shape.head_dim,
        subgroups,
        true,
    ));
    if (l.max_shared_memory_bytes as usize) < need {
        return Err(format!(
            "it needs {need} bytes of shared memory; the device has {}",
            l.max_shared_memory_bytes
        ));
    }
    Ok(())
}

/// Shared memory the tiled prefill kernel declares with a head-dimension slice of `slice`.
const fn tiled_prefill_shared(slice: usize) -> usize {
    slice * 784 + 16384
}

/// The head-dimension slice the tiled prefill stages per step on `device`: 32 where the shared
/// memory allows (half the barriers), else 16.
fn tiled_prefill_slice(device: &DeviceInfo) -> u32 {
    if device.limits.max_shared_memory_bytes as usize >= tiled_prefill_shared(32) {
        32
    } else {
        16
    }
}

/// Whether the tiled prefill kernel runs on `device` for `shape`; the error says why not.
fn tiled_prefill_fits(
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

/// Most query heads per KV head the vectorized decode kernel serves in one workgroup.
const VEC_MAX_GROUP: usize = 8;
/// Most head elements one lane of the vectorized decode kernel holds (`MAX_VALS` in the kernel).
const VEC_MAX_VALS: usize = 32;

/// Workgroup and tile sizes; each distinct value gives a distinct cached program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionOptions {
    /// Invocations per workgroup of the generic decode and prefill kernels and of the append: a
    /// power of two.
    pub local_size: u32,
    /// Positions per decode split of the generic kernel (flash-decoding chunk).
    pub chunk: u32,
    /// Fewest positions per split of the vectorized decode, which lengthens its splits beyond
    /// this so that a decode launches about `decode_workgroups` workgroups. 64 by default;
    /// [`AttentionOptions::for_device`] makes it 128 on Vulkan, where on an H200 it was up to
    /// 4.3 µs faster per step at L = 1k and 4k (Hkv = 8, L = 4k: 22.2 -> 17.9 µs) and the same
    /// elsewhere, while on OpenCL it was mixed (BENCHMARKS.md).
    pub decode_split_min: u32,
    /// Workgroups a vectorized decode aims to launch (enough to fill a large GPU several times).
    pub decode_workgroups: u32,
    /// Which decode kernel to run.
    pub decode: DecodeKernel,
    /// Which prefill kernel to run (`block_q` and `block_k` size the generic one).
    pub prefill: PrefillKernel,
    /// Invocations per workgroup of the vectorized decode kernel: a power of two.
    pub decode_local_size: u32,
    /// K/V rows each lane group of the vectorized decode kernel loads before using them
    /// (1 to 8): more hides more memory latency, at the cost of registers.
    pub decode_rows: u32,
    /// Grouped-query attention in the vectorized decode kernel: one workgroup per query head,
    /// the workgroups of one KV head adjacent so that they reread its rows mostly from L2 (`true`),
    /// or one workgroup per KV head serving all of its query heads (`false`).
    pub decode_spread: bool,
    /// Whether each lane group of the vectorized decode kernel loads its next rows while it uses
    /// the current ones (twice the registers for rows). Off by default: on an H200 it cost 3 to
    /// 11% at MHA shapes and 25 to 42% at Hkv=8 (74 -> 102 and 127 -> 168 registers;
    /// BENCHMARKS.md).
    pub decode_prefetch: bool,
    /// Whether the splits of the vectorized decode take the positions block-cyclically (one
    /// trip of rows at a time, split `s` taking trips `s`, `s + splits`, ...), so that the
    /// workgroups read one window of K and V at a time as a copy does, rather than each a
    /// contiguous range of its own. Off by default; [`AttentionOptions::for_device`] turns it on
    /// on OpenCL. On an H200 it was 0.7 to 1.6 µs faster per step on OpenCL at every shape but
    /// MHA L=1k (0.13 µs slower), and on Vulkan mixed: up to 1.1 µs faster at L <= 4k, 0.9 and
    /// 1.1 µs slower at Hkv=8 L=16k and 32k (BENCHMARKS.md).
    pub decode_cyclic: bool,
    /// Whether the Vulkan vectorized decode combines all query heads of a KV head at once, where
    /// they fit (`group * splits` at most 1024 and at most the kernel's row-merge buffer): every
    /// split's max and sum in one round trip, an invocation per 16-byte output column. Otherwise
    /// the heads are combined one after another. On by default: on an H200 it took 3.6 to
    /// 4.6 µs off each step at Hkv=8 and up to 1.8 µs at MHA shapes (BENCHMARKS.md). OpenCL
    /// keeps its own per-head combination either way.
    pub decode_combine_all: bool,
    /// Query rows per workgroup of the cooperative-matrix prefill, 16 per subgroup: 64 or 128.
    /// 128 (the default) was 11 to 33% faster on an H200 at L = 2k to 16k with either softmax, as
    /// measured before the kernel's accumulators moved out of local memory (BENCHMARKS.md); with
    /// [`PrefillKernel::Auto`], 64 is used where only it fits the head dimension.
    pub coop_rows: u32,
    /// Whether the cooperative-matrix prefill keeps its softmax in registers (64-key tiles) where
    /// the device's matrix layout allows it (a probe kernel checks, once per device), rather
    /// than in shared memory (32-key tiles). On by default; off only to compare the two.
    pub coop_registers: bool,
    /// Whether the tiled prefill loads the next staging step's Q, K or V words into registers
    /// before the current step's arithmetic, so that their round trip overlaps it, rather than
    /// loading them between two barriers. On by default; [`AttentionOptions::for_device`] turns
    /// it off on OpenCL. On an H200 it was 4 to 7% faster on Vulkan (177 registers instead of
    /// 163) and 14 to 16% slower on OpenCL, at L = 2k to 8k (BENCHMARKS.md).
    pub tiled_prefetch: bool,
    /// Query rows per workgroup of the generic prefill.
    pub block_q: u32,
    /// Key positions per prefill tile.
    pub block_k: u32,
}

impl Default for AttentionOptions {
    fn default() -> Self {
        AttentionOptions {
            local_size: 64,
            chunk: 64,
            decode_split_min: 64,
            decode_workgroups: 1024,
            decode: DecodeKernel::Auto,
            prefill: PrefillKernel::Auto,
            decode_local_size: 128,
            decode_rows: 4,
            decode_spread: false,
            decode_prefetch: false,
            decode_cyclic: false,
            decode_combine_all: true,
            coop_rows: 128,
            coop_registers: true,
            tiled_prefetch: true,
            block_q: 8,
            block_k: 32,
        }
    }
}

impl AttentionOptions {
    /// Sizes suited to `device`: the defaults, with the workgroup capped at the device's limit;
    /// on Vulkan splits of at least 128 positions, on OpenCL the tiled prefill's prefetch off and
    /// the decode's block-cyclic splits on (each measured faster that way there).
    pub fn for_device(device: &DeviceInfo) -> AttentionOptions {
        let opencl = device.backend == BackendKind::OpenCl;
        let mut o = AttentionOptions {
            tiled_prefetch: !opencl,
            decode_cyclic: opencl,
            decode_split_min: if opencl { 64 } else { 128 },
            ..AttentionOptions::default()
        };
        let max = device.limits.max_workgroup_invocations.max(1);
        while o.local_size > max {
            o.local_size /= 2;
        }
        while o.decode_local_size > max {
            o.decode_local_size /= 2;
        }
        o
    }
}

/// How the vectorized decode kernel is laid out on one device for one shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VecLayout {
    /// Invocations per K/V row.
    lanes: u32,
    /// OpenCL on NVIDIA: sum a row's lanes with the PTX warp shuffle instead of local memory.
    nv_shuffle: bool,
}

/// Whether the vectorized decode kernel runs on `device` for `shape` and `dtype`, and how; the error
/// says why not.
fn vec_layout(
    device: &DeviceInfo,
    shape: &AttentionShape,
    dtype: KvDtype,
    local_size: u32,
) -> std::result::Result<VecLayout, String> {
    let elems = 16 / dtype.bytes();
    if shape.head_dim % elems != 0 {
        return Err(format!(
            "head dimension {} is not a multiple of {elems} ({dtype:?} elements per 16-byte load)",
            shape.head_dim
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
            (sg.min(16), false)
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
    Ok(VecLayout { lanes, nv_shuffle })
}

/// The attention kernels for one shape and KV type on one context, with the scratch buffers their
/// splits need for caches of up to `capacity` positions.
///
/// Calls on one `Attention` are serialized internally where they share scratch; launches of one
/// `Attention` from several threads still run in submission order on the context's queue.
pub struct Attention {
    ctx: Context,
    shape: AttentionShape,
    dtype: KvDtype,
    capacity: usize,
    options: AttentionOptions,
    vec: Option<VecLayout>,
    /// The prefill kernel chosen (never `Auto`).
    prefill_kind: PrefillKernel,
    /// Whether the cooperative-matrix prefill keeps its softmax in registers.
    coop_quad: bool,
    /// The vectorized decode combines all query heads of a KV head at once (`COMBINE`).
    combine_all: bool,
    /// The generic path's append and reduce; the vectorized decode kernel does both itself.
    append: Option<Kernel>,
    decode: Kernel,
    reduce: Option<Kernel>,
    prefill: Kernel,
    part_o: Buffer<f32>,
    part_ml: Buffer<f32>,
    /// Splits finished per (batch, KV head) in the current vectorized launch; each launch's last
    /// workgroup resets its entry to zero.
    done: Buffer<u32>,
    new_k: Buffer<f32>,
    new_v: Buffer<f32>,
    step: parking_lot::Mutex<()>,
}

impl std::fmt::Debug for Attention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attention")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("capacity", &self.capacity)
            .field("options", &self.options)
            .field("decode", &self.decode_kernel())
            .field("prefill", &self.prefill_kernel())
            .finish()
    }
}

/// The shipped kernel `name` on `ctx`'s backend, specialized by `spec`: built, or served by the
/// context's memory or disk cache.
fn shipped_kernel(ctx: &Context, name: &str, spec: &SpecConstants) -> Result<Kernel> {
    let image = match ctx.backend() {
        BackendKind::Vulkan => crate::kernels::spirv_image(name)?,
        BackendKind::OpenCl => crate::kernels::opencl_image(name)?,
    };
    ctx.kernel(&image, name, spec, &BuildOptions::default())
}

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
            || !(1..=8).contains(&options.decode_rows)
            || options.block_q == 0
            || options.block_k == 0
        {
            return Err(Error::InvalidArgument(format!(
                "local sizes must be powers of two, decode rows 1 to 8, and chunk, decode split \
                 minimum, decode workgroups and blocks positive: {options:?}"
            )));
        }
        let device = ctx.device();
        let vec = match options.decode {
            DecodeKernel::Generic => None,
            DecodeKernel::Auto => vec_layout(device, shape, dtype, options.decode_local_size).ok(),
            DecodeKernel::Vectorized => Some(
                vec_layout(device, shape, dtype, options.decode_local_size).map_err(|why| {
                    Error::InvalidArgument(format!(
                        "the vectorized decode kernel cannot run here: {why}"
                    ))
                })?,
            ),
        };
        let mut options = options;
        if options.prefill == PrefillKernel::Auto
            && coop_prefill_fits(device, shape, dtype, options.coop_rows).is_err()
            && coop_prefill_fits(device, shape, dtype, 64).is_ok()
        {
            // 64 rows per workgroup also take head dimensions that are multiples of 32 only.
            options.coop_rows = 64;
        }
        let prefill_kind = match options.prefill {
            PrefillKernel::Generic => PrefillKernel::Generic,
            PrefillKernel::Auto
                if coop_prefill_fits(device, shape, dtype, options.coop_rows).is_ok() =>
            {
                PrefillKernel::Cooperative
            }
            PrefillKernel::Auto if tiled_prefill_fits(device, shape).is_ok() => {
                PrefillKernel::Tiled
            }
            PrefillKernel::Auto => PrefillKernel::Generic,
            PrefillKernel::Tiled => {
                tiled_prefill_fits(device, shape).map_err(|why| {
                    Error::InvalidArgument(format!(
                        "the tiled prefill kernel cannot run here: {why}"
                    ))
                })?;
                PrefillKernel::Tiled
            }
            PrefillKernel::Cooperative => {
                coop_prefill_fits(device, shape, dtype, options.coop_rows).map_err(|why| {
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
        let (bq, bk) = (options.block_q as usize, options.block_k as usize);
        let decode_shared = match vec {
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
                4 * (2 * rg + rg * shape.head_dim + local_sum)
            }
        };
        let prefill_shared = match prefill_kind {
            PrefillKernel::Cooperative => {
                coop_prefill_shared(shape.head_dim, options.coop_rows as usize / 16, coop_quad)
            }
            PrefillKernel::Tiled => tiled_prefill_shared(tiled_prefill_slice(device) as usize),
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
        let combine_all = vec.is_some_and(|v| {
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
                if ctx.backend() == BackendKind::OpenCl {
                    spec = spec.with(8, SpecValue::U32(u32::from(v.nv_shuffle)));
                }
                ("attn_decode_vec", spec)
            }
        };
        let decode = shipped_kernel(ctx, decode_name, &decode_spec)?;
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
            let reduce = shipped_kernel(ctx, "attn_reduce", &reduce_spec)?;
            let append_spec = SpecConstants::new().with(0, local).with(2, f16).with(3, d);
            let append = shipped_kernel(ctx, "attn_append", &append_spec)?;
            (Some(append), Some(reduce))
        };
        let (prefill_name, prefill_spec) = match prefill_kind {
            PrefillKernel::Cooperative => (
                "attn_prefill_coop",
                SpecConstants::new()
                    .with(0, SpecValue::U32(2 * options.coop_rows))
                    .with(3, d)
                    .with(4, SpecValue::U32(u32::from(coop_quad))),
            ),
            PrefillKernel::Tiled => (
                "attn_prefill_tiled",
                SpecConstants::new()
                    .with(2, f16)
                    .with(3, d)
                    .with(6, SpecValue::U32(tiled_prefill_slice(device)))
                    .with(7, SpecValue::U32(u32::from(options.tiled_prefetch))),
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
        let prefill = shipped_kernel(ctx, prefill_name, &prefill_spec)?;
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
        })
    }

    /// Splits per (batch, KV head) that make about `decode_workgroups` workgroups, or half as
    /// many where a workgroup serves several query heads: on an H200 (B=1, Hq=32, Hkv=8, L=16k
    /// and 32k) 512 workgroups beat 1024 by 7 to 9%, and 256 lost; with one query head per
    /// workgroup 1024 beat 512 by 13% (BENCHMARKS.md).
    fn vec_target(shape: &AttentionShape, options: AttentionOptions) -> usize {
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

    /// Whether the vectorized decode's all-heads combination fits (its `COMBINE` constant): every
    /// split's max and sum of a KV head's query heads, at the most splits this attention uses,
    /// must fit the kernel's 1024 cached weights and its row-merge buffer (row groups × D).
    fn combine_all_fits(
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

    /// The shape.
    pub fn shape(&self) -> &AttentionShape {
        &self.shape
    }

    /// The sizes in use.
    pub fn options(&self) -> AttentionOptions {
        self.options
    }

    /// The decode kernel chosen: [`DecodeKernel::Generic`] or [`DecodeKernel::Vectorized`].
    pub fn decode_kernel(&self) -> DecodeKernel {
        match self.vec {
            Some(_) => DecodeKernel::Vectorized,
            None => DecodeKernel::Generic,
        }
    }

    /// The prefill kernel chosen: [`PrefillKernel::Generic`], [`PrefillKernel::Tiled`] or
    /// [`PrefillKernel::Cooperative`].
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

    /// Every kernel it holds, for reporting where each came from and how long it took to acquire.
    pub fn kernels(&self) -> Vec<&Kernel> {
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

    /// Splits a decode over `len` positions uses.
    pub fn splits(&self, len: usize) -> usize {
        len.div_ceil(self.per_split(len))
    }

    /// Positions per split for a decode over `len` positions.
    fn per_split(&self, len: usize) -> usize {
        match self.vec {
            None => self.options.chunk as usize,
            Some(_) => len
                .div_ceil(Self::vec_target(&self.shape, self.options))
                .max(self.options.decode_split_min as usize),
        }
    }

    /// The most splits the vectorized decode uses over at most `capacity` positions.
    fn vec_most_splits(
        shape: &AttentionShape,
        options: AttentionOptions,
        capacity: usize,
    ) -> usize {
        capacity
            .div_ceil(options.decode_split_min as usize)
            .min(Self::vec_target(shape, options))
    }

    fn check_cache(&self, cache: &KvCache) -> Result<()> {
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

    /// The split launch's groups and push constants for a decode over `len` positions of `cache`.
    fn split_launch(
        &self,
        len: usize,
        capacity: usize,
        append: bool,
    ) -> ([u32; 3], PushConstants, u32) {
        let s = &self.shape;
        let per = self.per_split(len);
        let splits = len.div_ceil(per) as u32;
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        match self.vec {
            None => (
                [splits, (s.batch * s.q_heads) as u32, 1],
                PushConstants::new()
                    .u32(len as u32)
                    .u32(capacity as u32)
                    .u32(s.q_heads as u32)
                    .u32((s.q_heads / s.kv_heads) as u32)
                    .f32(scale),
                splits,
            ),
            Some(_) => (
                [
                    splits
                        * if self.options.decode_spread {
                            (s.q_heads / s.kv_heads) as u32
                        } else {
                            1
                        },
                    (s.batch * s.kv_heads) as u32,
                    1,
                ],
                PushConstants::new()
                    .u32(len as u32)
                    .u32(capacity as u32)
                    .u32(s.kv_heads as u32)
                    .u32(per as u32)
                    .f32(scale)
                    .u32(u32::from(append)),
                splits,
            ),
        }
    }

    /// One query per (batch, query head) against every filled position of `cache`, without
    /// appending: `q` and `out` are `[batch][q_head][head_dim]`. Used for cross-attention over a
    /// static K/V set. Returns the event of the batch: one launch on the vectorized path, split and
    /// reduce on the generic one.
    ///
    /// Errors: [`Error::Size`] for `q` or `out` of the wrong length or a cache larger than the
    /// capacity; [`Error::InvalidArgument`] for an empty cache or one of another shape or type.
    pub fn attend(&self, cache: &KvCache, q: &Buffer<f32>, out: &Buffer<f32>) -> Result<Event> {
        self.check_cache(cache)?;
        check_len("q", q.len(), self.shape.q_elems())?;
        check_len("out", out.len(), self.shape.q_elems())?;
        if cache.is_empty() {
            return Err(Error::InvalidArgument(
                "attention over an empty KV cache".into(),
            ));
        }
        let _scratch = self.step.lock();
        // The vectorized kernel reads no new row without the append flag; any buffers of the right
        // type fill those bindings.
        self.submit_step(cache, q, None, out, cache.len())
    }

    /// One decode step as a single submission: `k_new` and `v_new` (device buffers,
    /// `[batch][kv_head][head_dim]` f32, as a projection leaves them) are written into `cache` at
    /// position [`KvCache::len`], converted to the cache's type, and `q` attends every position
    /// including the new one (causal decode: the query is the newest token), into `out`. On the
    /// vectorized path this is one launch that also combines its splits; on the generic path three
    /// (`attn_append`, `attn_decode`, `attn_reduce`). No host copy and no host wait inside.
    ///
    /// Errors: [`Error::Size`] for buffers of the wrong length or a full cache (nothing is launched
    /// then); [`Error::InvalidArgument`] for a cache of another shape or type.
    pub fn decode(
        &self,
        cache: &mut KvCache,
        q: &Buffer<f32>,
        k_new: &Buffer<f32>,
        v_new: &Buffer<f32>,
        out: &Buffer<f32>,
    ) -> Result<Event> {
        self.check_step(cache, q, out, k_new.len(), v_new.len())?;
        let _scratch = self.step.lock();
        self.append_and_submit(cache, q, k_new, v_new, out)
    }

    /// What a decode step checks before anything is written or launched: the cache (shape, type,
    /// room for one more position) and the lengths of `q`, `out` and the new row.
    fn check_step(
        &self,
        cache: &KvCache,
        q: &Buffer<f32>,
        out: &Buffer<f32>,
        k_len: usize,
        v_len: usize,
    ) -> Result<()> {
        self.check_cache(cache)?;
        check_len("q", q.len(), self.shape.q_elems())?;
        check_len("out", out.len(), self.shape.q_elems())?;
        check_len("appended k", k_len, self.shape.kv_step_elems())?;
        check_len("appended v", v_len, self.shape.kv_step_elems())?;
        cache.check_room()
    }

    /// Submits a checked step (see `check_step`); the caller holds `step`.
    fn append_and_submit(
        &self,
        cache: &mut KvCache,
        q: &Buffer<f32>,
        k_new: &Buffer<f32>,
        v_new: &Buffer<f32>,
        out: &Buffer<f32>,
    ) -> Result<Event> {
        let len = cache.len() + 1;
        let event = self.submit_step(cache, q, Some((k_new, v_new)), out, len)?;
        cache.len = len;
        Ok(event)
    }

    /// Submits attention of `q` over the first `len` positions of `cache`; with `new`, position
    /// `len - 1` is first written from it. The caller holds `step` and has checked the arguments.
    fn submit_step(
        &self,
        cache: &KvCache,
        q: &Buffer<f32>,
        new: Option<(&Buffer<f32>, &Buffer<f32>)>,
        out: &Buffer<f32>,
        len: usize,
    ) -> Result<Event> {
        let (groups, split_push, splits) = self.split_launch(len, cache.capacity(), new.is_some());
        let (k, v) = cache.buffers();
        let (Some(append), Some(reduce)) = (&self.append, &self.reduce) else {
            let (nk, nv) = new.unwrap_or((&self.new_k, &self.new_v));
            let args: [&dyn BufferArg; 9] = [
                q,
                k,
                v,
                &self.part_o,
                &self.part_ml,
                nk,
                nv,
                &self.done,
                out,
            ];
            return self.ctx.queue().submit(&[LaunchDesc {
                kernel: &self.decode,
                groups,
                buffers: &args,
                push_constants: split_push.as_bytes(),
            }]);
        };
        let reduce_push = PushConstants::new().u32(splits);
        let decode_args: [&dyn BufferArg; 5] = [q, k, v, &self.part_o, &self.part_ml];
        let reduce_args: [&dyn BufferArg; 3] = [&self.part_o, &self.part_ml, out];
        let split = LaunchDesc {
            kernel: &self.decode,
            groups,
            buffers: &decode_args,
            push_constants: split_push.as_bytes(),
        };
        let combine = LaunchDesc {
            kernel: reduce,
            groups: [(self.shape.batch * self.shape.q_heads) as u32, 1, 1],
            buffers: &reduce_args,
            push_constants: reduce_push.as_bytes(),
        };
        let Some((k_new, v_new)) = new else {
            return self.ctx.queue().submit(&[split, combine]);
        };
        let pos = len - 1;
        let pairs = self.shape.kv_step_elems() / 2;
        let append_groups = (pairs.div_ceil(self.options.local_size as usize) as u32)
            .clamp(1, self.ctx.device().limits.max_workgroup_count[0].max(1));
        let append_push = PushConstants::new()
            .u32(pos as u32)
            .u32(1)
            .u32(cache.capacity() as u32)
            .u32(pairs as u32);
        let append_args: [&dyn BufferArg; 4] = [k_new, v_new, k, v];
        self.ctx.queue().submit(&[
            LaunchDesc {
                kernel: append,
                groups: [append_groups, 1, 1],
                buffers: &append_args,
                push_constants: append_push.as_bytes(),
            },
            split,
            combine,
        ])
    }

    /// Causal attention for `len` new positions: appends `k` and `v` (`[batch][kv_head][len][head_dim]`)
    /// to `cache` after its current [`KvCache::len`] positions, then attends `q`
    /// (`[batch][q_head][len][head_dim]`) over the cache, query `i` seeing every position up to its
    /// own, and writes `out` in `q`'s layout. On an empty cache this is a prompt's prefill; on a
    /// filled one, a chunk of a longer prompt. Tiles that the mask hides entirely are skipped.
    ///
    /// Errors: [`Error::InvalidArgument`] for `len == 0` or a cache of another shape or type;
    /// [`Error::Size`] for slices or buffers of the wrong length, a cache larger than the capacity, or
    /// positions past the cache's capacity (nothing is written or launched then).
    pub fn prefill(
        &self,
        cache: &mut KvCache,
        q: &Buffer<f32>,
        k: &[f32],
        v: &[f32],
        len: usize,
        out: &Buffer<f32>,
    ) -> Result<Event> {
        self.check_cache(cache)?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "prefill needs at least one position".into(),
            ));
        }
        check_len("prefill q", q.len(), self.shape.q_elems() * len)?;
        check_len("prefill out", out.len(), self.shape.q_elems() * len)?;
        let n = self.shape.kv_step_elems() * len;
        check_len("prefill k", k.len(), n)?;
        check_len("prefill v", v.len(), n)?;
        let start = cache.len();
        if start + len > cache.capacity() {
            return Err(Error::Size {
                what: "KV cache prefill".into(),
                got: format!("{len} positions after {start}"),
                expected: format!("at most the capacity {} in all", cache.capacity()),
            });
        }
        cache.write_rows(start, len, k, v)?;
        cache.len = start + len;
        self.prefill_cached(cache, q, len, out)
    }

    /// The attention half of [`Attention::prefill`], for K and V already in the cache: its last
    /// `len` positions are the queries' own (written by [`KvCache::write`], [`KvCache::fill`] or
    /// an earlier prefill), and `q` (`[batch][q_head][len][head_dim]`) attends over the whole
    /// cache, query `i` seeing every position up to its own; `out` is written in `q`'s layout.
    /// Nothing is uploaded, so running it again over the same cache gives the same output.
    ///
    /// Errors: [`Error::InvalidArgument`] for `len == 0`, `len` past the cache's length, or a cache
    /// of another shape or type; [`Error::Size`] for buffers of the wrong length (nothing is
    /// launched then).
    pub fn prefill_cached(
        &self,
        cache: &KvCache,
        q: &Buffer<f32>,
        len: usize,
        out: &Buffer<f32>,
    ) -> Result<Event> {
        self.check_cache(cache)?;
        if len == 0 || len > cache.len() {
            return Err(Error::InvalidArgument(format!(
                "prefill over the cache needs 1 to {} positions (the cache's length); got {len}",
                cache.len()
            )));
        }
        check_len("prefill q", q.len(), self.shape.q_elems() * len)?;
        check_len("prefill out", out.len(), self.shape.q_elems() * len)?;
        let block_q = match self.prefill_kind {
            PrefillKernel::Cooperative => self.options.coop_rows as usize,
            PrefillKernel::Tiled => 64,
            _ => self.options.block_q as usize,
        };
        let tiles = len.div_ceil(block_q) as u32;
        let rows = (self.shape.batch * self.shape.q_heads) as u32;
        let push = PushConstants::new()
            .u32(len as u32)
            .u32(cache.len() as u32)
            .u32(cache.capacity() as u32)
            .u32(self.shape.q_heads as u32)
            .u32((self.shape.q_heads / self.shape.kv_heads) as u32)
            .f32(1.0 / (self.shape.head_dim as f32).sqrt());
        // The tiled and cooperative kernels take the query tile from y, last first, so that every
        // head's longest (causal) tiles are dispatched first: with the tile in x, one head's
        // tiles went out longest to shortest before the next head's, and the last heads' long
        // tiles started near the end.
        let groups = match self.prefill_kind {
            PrefillKernel::Tiled | PrefillKernel::Cooperative => [rows, tiles, 1],
            _ => [tiles, rows, 1],
        };
        let (kb, vb) = cache.buffers();
        self.ctx
            .queue()
            .launch(&self.prefill, groups, &[q, kb, vb, out], push.as_bytes())
    }

    /// [`Attention::decode`] with the new position's K and V given on the host
    /// (`[batch][kv_head][head_dim]`): they are uploaded to the attention's own staging buffers
    /// first (two host copies), then the step is submitted as one batch.
    ///
    /// Errors: as [`Attention::decode`], and [`Error::Size`] for slices of the wrong length (nothing
    /// is written or launched then); the buffers' write errors.
    pub fn decode_step(
        &self,
        cache: &mut KvCache,
        q: &Buffer<f32>,
        k_new: &[f32],
        v_new: &[f32],
        out: &Buffer<f32>,
    ) -> Result<Event> {
        self.check_step(cache, q, out, k_new.len(), v_new.len())?;
        // Held across the upload and the submission, so that another thread's step cannot
        // overwrite the staged row before this step's append has read it.
        let _scratch = self.step.lock();
        self.new_k.write(k_new)?;
        self.new_v.write(v_new)?;
        self.append_and_submit(cache, q, &self.new_k, &self.new_v, out)
    }
}

#[cfg(test)]
mod tests {
    use super::quad_layout;

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
