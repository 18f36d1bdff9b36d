//! `kpc_mha`: ncnn's MultiHeadAttention layer on a context (see `kpc_attention::mha`): created
//! with its parameters and weights, then prefill, decode steps, cross-attention memory, and the
//! self-attention cache exported and imported in ncnn's two layouts.

use parking_lot::Mutex;

use super::interop::read_versioned;
use super::registry::{self, Object};
use super::tensor::{TensorObj, kpc_tensor, opt_tensor};
use super::util::{check_out, slice_arg, switch_arg, write_out};
use super::{Failure, guard, kpc_context, kpc_status};
use kpc::Context;
use kpc::Error;
use kpc_attention::mha::CacheLayout;
use kpc_attention::{KvDtype, MhaKind, MhaParams, MhaWeights, MultiHeadAttention, Tensor};

/// A MultiHeadAttention layer (opaque). One call at a time runs on a layer (others wait); destroy
/// with `kpc_mha_destroy`.
pub struct kpc_mha {
    _opaque: [u8; 0],
}

struct Layer(Mutex<MultiHeadAttention>);

impl Object for Layer {
    type Handle = kpc_mha;
    const NAME: &'static str = "kpc_mha";
}

/// A layer's parameters, ncnn's ids in brackets. Fill it with `kpc_mha_params_init`, then change
/// fields. Versioned: `struct_size` must be at least `sizeof(kpc_mha_params)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kpc_mha_params {
    /// `sizeof(kpc_mha_params)`.
    pub struct_size: u32,
    /// Width of Q, K, V inside the layer (0).
    pub embed_dim: u32,
    /// Query heads (1).
    pub num_heads: u32,
    /// Key/value heads (grouped-query attention); equal to `num_heads` for MHA.
    pub num_kv_heads: u32,
    /// Query input and output width (weight_data_size / embed_dim).
    pub qdim: u32,
    /// Key input width (3).
    pub kdim: u32,
    /// Value input width (4).
    pub vdim: u32,
    /// Logit scale (6); 0 means 1/sqrt(head_dim).
    pub scale: f32,
    /// 1: every call takes an additive mask (5). A mask value is added to its logit: -inf masks the
    /// key; finite values are added as they are (a row whose keys all get the same huge negative
    /// value, -1e30 or -FLT_MAX, weighs them uniformly, as softmax does). A query row whose every
    /// key is -inf attends to nothing: its attention output is zeros and the layer outputs its
    /// output bias for it, on every backend. NaN and +inf are `KPC_STATUS_INVALID_ARGUMENT`.
    pub attn_mask: i32,
    /// 1: self-attention keeps K/V across calls (7).
    pub kv_cache: i32,
    /// 0: self-attention; 1: cross-attention.
    pub cross: i32,
    /// 1: causal self-attention.
    pub causal: i32,
    /// Sequences per call.
    pub batch: u32,
    /// Positions of the cache (self) or memory (cross).
    pub capacity: u32,
    /// 1: weights stored as fp16.
    pub weight_f16: i32,
    /// 1: K/V cache stored as fp16.
    pub cache_f16: i32,
}

/// The layout of exported or imported cache blobs.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kpc_cache_layout {
    /// ncnn's MultiHeadAttention cache, transposed: per sequence `[kv_dim][len]`.
    KPC_CACHE_LAYOUT_MHA = 1,
    /// ncnn's SDPA cache: per sequence `[kv_heads][len][head_dim]`.
    KPC_CACHE_LAYOUT_SDPA = 2,
}

fn layout_arg(v: i32) -> Result<CacheLayout, Failure> {
    match v {
        1 => Ok(CacheLayout::MhaTransposed),
        2 => Ok(CacheLayout::Sdpa),
        _ => Err(Failure::invalid(format!(
            "layout is {v}: expected KPC_CACHE_LAYOUT_MHA (1) or KPC_CACHE_LAYOUT_SDPA (2)"
        ))),
    }
}

/// Fills `*out` with ncnn's defaults for `embed_dim` and `num_heads` (MHA, qdim = kdim = vdim =
/// embed_dim, default scale, no mask, caching on, causal self-attention, one sequence, 1024
/// positions, fp32 weights and cache) and sets `struct_size`.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a NULL or misaligned `out`.
///
/// # Safety
/// `out` is NULL or points to a writable `kpc_mha_params`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_params_init(
    out: *mut kpc_mha_params,
    embed_dim: u32,
    num_heads: u32,
) -> kpc_status {
    guard("kpc_mha_params_init", || {
        let p = kpc_mha_params {
            struct_size: std::mem::size_of::<kpc_mha_params>() as u32,
            embed_dim,
            num_heads,
            num_kv_heads: num_heads,
            qdim: embed_dim,
            kdim: embed_dim,
            vdim: embed_dim,
            scale: 0.0,
            attn_mask: 0,
            kv_cache: 1,
            cross: 0,
            causal: 1,
            batch: 1,
            capacity: 1024,
            weight_f16: 0,
            cache_f16: 0,
        };
        // SAFETY: forwarded to the caller.
        unsafe { write_out(out, p, "out") }
    })
}

fn params_of(c: &kpc_mha_params) -> Result<MhaParams, Failure> {
    let dtype = |v: i32, what: &str| -> Result<KvDtype, Failure> {
        Ok(if switch_arg(v, what)? {
            KvDtype::F16
        } else {
            KvDtype::F32
        })
    };
    Ok(MhaParams {
        embed_dim: c.embed_dim as usize,
        num_heads: c.num_heads as usize,
        num_kv_heads: c.num_kv_heads as usize,
        qdim: c.qdim as usize,
        kdim: c.kdim as usize,
        vdim: c.vdim as usize,
        scale: (c.scale != 0.0).then_some(c.scale),
        attn_mask: switch_arg(c.attn_mask, "params.attn_mask")?,
        kv_cache: switch_arg(c.kv_cache, "params.kv_cache")?,
        kind: if switch_arg(c.cross, "params.cross")? {
            MhaKind::CrossAttention
        } else {
            MhaKind::SelfAttention
        },
        causal: switch_arg(c.causal, "params.causal")?,
        batch: c.batch as usize,
        capacity: c.capacity as usize,
        weight_dtype: dtype(c.weight_f16, "params.weight_f16")?,
        cache_dtype: dtype(c.cache_f16, "params.cache_f16")?,
        ..MhaParams::new(c.embed_dim as usize, c.num_heads as usize)
    })
}

/// Creates a layer on `context` with `params` and `weights`: `count` floats holding q_weight,
/// q_bias, k_weight, k_bias, v_weight, v_bias, out_weight, out_bias in ncnn's order and shapes
/// (each matrix `[out_features][in_features]` row-major). The weights are copied to the device;
/// the caller's array may be freed afterwards.
///
/// Ownership: `*out` receives a new layer; destroy it with `kpc_mha_destroy`.
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` (bad handle, NULL pointers, an invalid parameter: the
/// message names it); `KPC_STATUS_SIZE` (a weight count that does not fit the parameters: the
/// message lists each array's size); kernel build and allocation errors.
///
/// # Safety
/// `params` points to an initialized `kpc_mha_params`; `weights` to `count` floats; `out` is NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_create(
    context: *const kpc_context,
    params: *const kpc_mha_params,
    weights: *const f32,
    count: usize,
    out: *mut *mut kpc_mha,
) -> kpc_status {
    guard("kpc_mha_create", || {
        check_out(out, "out")?;
        let ctx = registry::get::<Context>(context, "context")?;
        // SAFETY: forwarded to the caller.
        let p = params_of(&unsafe { read_versioned(params, "kpc_mha_params") }?)?;
        // SAFETY: forwarded to the caller.
        let flat = unsafe { slice_arg(weights, count, "weights") }?;
        p.validate()?;
        let w = MhaWeights::from_ncnn(flat, &p)?;
        let layer = MultiHeadAttention::new(&ctx, &p, &w)?;
        let h = registry::insert(Layer(Mutex::new(layer)));
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(out, h, "out") }
    })
}

/// Destroys a layer. NULL is accepted and does nothing.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` when `layer` is not a live layer.
///
/// # Safety
/// None beyond the handle's (which is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_destroy(layer: *mut kpc_mha) -> kpc_status {
    guard("kpc_mha_destroy", || {
        registry::remove::<Layer>(layer, "layer")
    })
}

/// Copies `result` to `out` (`out_count` floats), which must be exactly its length.
///
/// # Safety
/// `out` is NULL or points to `out_count` writable floats.
unsafe fn write_floats(
    result: &[f32],
    out: *mut f32,
    out_count: usize,
    what: &str,
) -> Result<(), Failure> {
    if out_count != result.len() {
        return Err(Error::Size {
            what: what.into(),
            got: format!("{out_count} floats"),
            expected: format!("{} floats", result.len()),
        }
        .into());
    }
    check_out(out, what)?;
    // SAFETY: non-NULL and aligned (checked), `out_count` writable floats by the caller's promise.
    unsafe { std::ptr::copy_nonoverlapping(result.as_ptr(), out, out_count) };
    Ok(())
}

/// The mask argument: NULL (with count 0) for none.
///
/// # Safety
/// As `slice_arg`.
unsafe fn mask_arg<'a>(mask: *const f32, count: usize) -> Result<Option<&'a [f32]>, Failure> {
    if mask.is_null() && count == 0 {
        return Ok(None);
    }
    // SAFETY: forwarded to the caller.
    unsafe { slice_arg(mask, count, "mask") }.map(Some)
}

/// Self-attention over `len` new positions (appended to the cache; with `kv_cache` 0 they replace
/// its positions), or cross-attention of `len` queries over the memory: `x` is `[batch][len][qdim]`
/// (`x_count` floats), `out` receives `[batch][len][qdim]` (`out_count` must be that). `mask`
/// (NULL, 0 for none) is `[len][kv_len]` or `[num_heads][len][kv_len]` for layers made with
/// `attn_mask`; `kpc_mha_params.attn_mask` says what its values mean.
///
/// Errors: `KPC_STATUS_SIZE` (an input, mask or output of the wrong size, or positions past the
/// capacity); `KPC_STATUS_INVALID_ARGUMENT` (bad handle, NULL pointers, non-finite input, NaN or
/// +inf in the mask, a mask against the layer's `attn_mask`); `KPC_STATUS_CALL_ORDER`
/// (cross-attention before `kpc_mha_set_memory`). Nothing changes then: every check comes first,
/// and the cache keeps its length and contents (`kpc_mha_len`, `kpc_mha_export_cache`).
///
/// # Safety
/// `x` points to `x_count` floats, `mask` to `mask_count` (or is NULL with 0), `out` to
/// `out_count` writable floats.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kpc_mha_prefill(
    layer: *mut kpc_mha,
    x: *const f32,
    x_count: usize,
    len: u32,
    mask: *const f32,
    mask_count: usize,
    out: *mut f32,
    out_count: usize,
) -> kpc_status {
    guard("kpc_mha_prefill", || {
        let l = registry::get::<Layer>(layer, "layer")?;
        // SAFETY: forwarded to the caller.
        let (x, mask) = unsafe { (slice_arg(x, x_count, "x")?, mask_arg(mask, mask_count)?) };
        check_out(out, "out")?;
        let mut l = l.0.lock();
        let p = *l.params();
        let want = p.batch * len as usize * p.qdim;
        if out_count != want {
            return Err(Error::Size {
                what: "prefill output".into(),
                got: format!("{out_count} floats"),
                expected: format!("{want} floats ([batch][len][qdim])"),
            }
            .into());
        }
        let y = l.prefill(x, len as usize, mask)?;
        // SAFETY: forwarded to the caller.
        unsafe { write_floats(&y, out, out_count, "prefill output") }
    })
}

/// One decode step: `x` is `[batch][qdim]`, `out` receives `[batch][qdim]`. Self-attention appends
/// the token's K/V in place; cross-attention attends the memory. `mask` as for `kpc_mha_prefill`
/// with one query.
///
/// Errors: as `kpc_mha_prefill`; `KPC_STATUS_CALL_ORDER` also for a self-attention layer made
/// with `kv_cache` 0; `KPC_STATUS_SIZE` for a full cache.
///
/// # Safety
/// As `kpc_mha_prefill`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_step(
    layer: *mut kpc_mha,
    x: *const f32,
    x_count: usize,
    mask: *const f32,
    mask_count: usize,
    out: *mut f32,
    out_count: usize,
) -> kpc_status {
    guard("kpc_mha_step", || {
        let l = registry::get::<Layer>(layer, "layer")?;
        // SAFETY: forwarded to the caller.
        let (x, mask) = unsafe { (slice_arg(x, x_count, "x")?, mask_arg(mask, mask_count)?) };
        check_out(out, "out")?;
        let mut l = l.0.lock();
        let p = *l.params();
        if out_count != p.batch * p.qdim {
            return Err(Error::Size {
                what: "step output".into(),
                got: format!("{out_count} floats"),
                expected: format!("{} floats ([batch][qdim])", p.batch * p.qdim),
            }
            .into());
        }
        let y = l.step(x, mask)?;
        // SAFETY: forwarded to the caller.
        unsafe { write_floats(&y, out, out_count, "step output") }
    })
}

/// Cross-attention: projects the encoder's states to K/V once and keeps them as the memory:
/// `keys` `[batch][len][kdim]`, `values` `[batch][len][vdim]` or NULL (with 0) for the same states
/// as `keys`. Replaces any earlier memory.
///
/// Errors: `KPC_STATUS_CALL_ORDER` on a self-attention layer; `KPC_STATUS_SIZE` for states of the
/// wrong size or more positions than the capacity; `KPC_STATUS_INVALID_ARGUMENT` otherwise. The old
/// memory is kept then.
///
/// # Safety
/// `keys` points to `keys_count` floats, `values` to `values_count` (or is NULL with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_set_memory(
    layer: *mut kpc_mha,
    keys: *const f32,
    keys_count: usize,
    values: *const f32,
    values_count: usize,
    len: u32,
) -> kpc_status {
    guard("kpc_mha_set_memory", || {
        let l = registry::get::<Layer>(layer, "layer")?;
        // SAFETY: forwarded to the caller.
        let keys = unsafe { slice_arg(keys, keys_count, "keys") }?;
        let values = if values.is_null() && values_count == 0 {
            None
        } else {
            // SAFETY: forwarded to the caller.
            Some(unsafe { slice_arg(values, values_count, "values") }?)
        };
        Ok(l.0.lock().set_memory(keys, values, len as usize)?)
    })
}

/// Writes the positions in the self-attention cache (or the cross-attention memory) to `*out`.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle or `out`.
///
/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_len(layer: *const kpc_mha, out: *mut u32) -> kpc_status {
    guard("kpc_mha_len", || {
        let l = registry::get::<Layer>(layer, "layer")?;
        let n = l.0.lock().len() as u32;
        // SAFETY: forwarded to the caller.
        unsafe { write_out(out, n, "out") }
    })
}

/// Exports the self-attention cache's K and V in `layout` (a `kpc_cache_layout` value): each blob
/// is `*count = batch * kv_heads * head_dim * len` floats. Call with `k` and `v` NULL and
/// `capacity` 0 to ask the count.
///
/// Errors: `KPC_STATUS_BUFFER_TOO_SMALL` when `capacity < *count` (nothing is copied);
/// `KPC_STATUS_CALL_ORDER` on a cross-attention layer; `KPC_STATUS_INVALID_ARGUMENT` for a bad
/// handle, layout or pointer.
///
/// # Safety
/// `k` and `v` are NULL (with `capacity` 0) or point to `capacity` writable floats each; `count` is
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_export_cache(
    layer: *const kpc_mha,
    layout: i32,
    k: *mut f32,
    v: *mut f32,
    capacity: usize,
    count: *mut usize,
) -> kpc_status {
    guard("kpc_mha_export_cache", || {
        let l = registry::get::<Layer>(layer, "layer")?;
        let layout = layout_arg(layout)?;
        check_out(count, "count")?;
        let (ks, vs) = l.0.lock().export_cache(layout)?;
        // SAFETY: checked above; writable by the caller's promise.
        unsafe { write_out(count, ks.len(), "count")? };
        if k.is_null() && v.is_null() && capacity == 0 {
            return Ok(());
        }
        if capacity < ks.len() {
            return Err(Failure {
                status: kpc_status::KPC_STATUS_BUFFER_TOO_SMALL,
                message: format!(
                    "each cache blob needs {} floats, the buffers have {capacity} (the count was \
                     written to *count)",
                    ks.len()
                ),
            });
        }
        // SAFETY: forwarded to the caller: `capacity >= len` writable floats each.
        unsafe {
            write_floats(&ks, k, ks.len(), "k")?;
            write_floats(&vs, v, vs.len(), "v")
        }
    })
}

/// Replaces the self-attention cache with `len` positions given in `layout`: `k` and `v` hold
/// `count = batch * kv_heads * head_dim * len` floats each, as `kpc_mha_export_cache` writes them.
///
/// Errors: `KPC_STATUS_SIZE` (wrong count, `len` past the capacity); `KPC_STATUS_CALL_ORDER` on a
/// cross-attention layer; `KPC_STATUS_INVALID_ARGUMENT` for a value that is not finite or, in an
/// fp16 cache (`cache_f16`), outside fp16's range (magnitude 65520 or more, which fp16 would store as
/// infinity; 65504 is its largest value): the message names the first such value and its index; and
/// for a bad handle, layout or pointer. The cache is unchanged then.
///
/// # Safety
/// `k` and `v` point to `count` floats each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_import_cache(
    layer: *mut kpc_mha,
    layout: i32,
    k: *const f32,
    v: *const f32,
    count: usize,
    len: u32,
) -> kpc_status {
    guard("kpc_mha_import_cache", || {
        let l = registry::get::<Layer>(layer, "layer")?;
        let layout = layout_arg(layout)?;
        // SAFETY: forwarded to the caller.
        let (k, v) = unsafe { (slice_arg(k, count, "k")?, slice_arg(v, count, "v")?) };
        Ok(l.0.lock().import_cache(layout, k, v, len as usize)?)
    })
}

/// A decode step on device tensors, submitted with no host copy and no wait: `x` `[batch][qdim]`
/// in (fp16 or f32), `out` `[batch][qdim]` written (fp16 or f32), `mask` an f32 tensor
/// `[1][kv_len]` or `[num_heads][1][kv_len]` (layers with `attn_mask`) or NULL. A read of `out`
/// (`kpc_tensor_read_f32`) waits for the step. Device values are not inspected: a NaN in `x` or the
/// mask gives NaN outputs.
///
/// Errors: `KPC_STATUS_INVALID_ARGUMENT` for a bad handle, a tensor of another context, of an
/// unaccepted type (the mask is f32) or a mask against the layer's `attn_mask`; `KPC_STATUS_SIZE`
/// for a tensor of the wrong shape or a full cache; `KPC_STATUS_CALL_ORDER` as `kpc_mha_step`.
/// Nothing is written or launched then.
///
/// # Safety
/// None beyond the handles' (which are checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_step_tensor(
    layer: *mut kpc_mha,
    x: *const kpc_tensor,
    out: *mut kpc_tensor,
    mask: *const kpc_tensor,
) -> kpc_status {
    guard("kpc_mha_step_tensor", || {
        tensor_call(layer, x, out, mask, MultiHeadAttention::step_device)
    })
}

/// The handles of a tensor call (step or prefill) checked and looked up, then `call` on the layer.
fn tensor_call(
    layer: *mut kpc_mha,
    x: *const kpc_tensor,
    out: *mut kpc_tensor,
    mask: *const kpc_tensor,
    call: fn(&mut MultiHeadAttention, &Tensor, &mut Tensor, Option<&Tensor>) -> kpc::Result<()>,
) -> Result<(), Failure> {
    let l = registry::get::<Layer>(layer, "layer")?;
    let x = registry::get::<TensorObj>(x, "x")?;
    let out = registry::get::<TensorObj>(out, "out")?;
    let mask = opt_tensor(mask, "mask")?;
    let mut y = out.0.clone();
    Ok(call(
        &mut l.0.lock(),
        &x.0,
        &mut y,
        mask.as_ref().map(|m| &m.0),
    )?)
}

/// A prefill on device tensors, submitted with no host copy and no wait: `x` `[batch][len][qdim]`
/// (fp16 or f32; `len` is its second dimension), `out` of the same shape, `mask` an f32 tensor
/// `[len][kv_len]` or `[num_heads][len][kv_len]` or NULL.
///
/// Errors: as `kpc_mha_step_tensor`, and `KPC_STATUS_SIZE` for positions past the capacity.
/// Nothing is written, launched or forgotten then.
///
/// # Safety
/// None beyond the handles' (which are checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_prefill_tensor(
    layer: *mut kpc_mha,
    x: *const kpc_tensor,
    out: *mut kpc_tensor,
    mask: *const kpc_tensor,
) -> kpc_status {
    guard("kpc_mha_prefill_tensor", || {
        tensor_call(layer, x, out, mask, MultiHeadAttention::prefill_device)
    })
}

/// Cross-attention memory from device tensors: `keys` `[batch][len][kdim]`, `values`
/// `[batch][len][vdim]` or NULL for the keys as values (kdim == vdim); fp16 or f32. Submitted with
/// no wait.
///
/// Errors: as `kpc_mha_set_memory`; `KPC_STATUS_INVALID_ARGUMENT` for a tensor of another context;
/// `KPC_STATUS_SIZE` for a tensor of the wrong shape. The old memory is kept then.
///
/// # Safety
/// None beyond the handles' (which are checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kpc_mha_set_memory_tensor(
    layer: *mut kpc_mha,
    keys: *const kpc_tensor,
    values: *const kpc_tensor,
) -> kpc_status {
    guard("kpc_mha_set_memory_tensor", || {
        let l = registry::get::<Layer>(layer, "layer")?;
        let keys = registry::get::<TensorObj>(keys, "keys")?;
        let values = opt_tensor(values, "values")?;
        Ok(l.0
            .lock()
            .set_memory_device(&keys.0, values.as_ref().map(|v| &v.0))?)
    })
}
