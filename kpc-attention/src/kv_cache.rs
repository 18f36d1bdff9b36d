//! [`KvCache`]: one layer's K and V on the device, appended in place, one position at a time or a
//! prompt at a time.

use kpc::{Buffer, BufferArg, Context};
use kpc::{Error, Result};

use super::{AttentionShape, KvDtype, check_len};

enum KvStore {
    F32 { k: Buffer<f32>, v: Buffer<f32> },
    F16 { k: Buffer<u16>, v: Buffer<u16> },
}

/// Positions of slack after the last head's capacity in each buffer: the cooperative-matrix decode
/// loads K in whole 16-row tiles, and a partial last tile of the last head reads up to 15 rows
/// past its capacity (their scores are masked). Never read as data, never written.
const SLACK_ROWS: usize = 16;

/// One layer's K and V on the device: `[batch][kv_head][position][head_dim]`, `capacity` positions
/// per head, of which the first [`KvCache::len`] are filled.
pub struct KvCache {
    shape: AttentionShape,
    capacity: usize,
    pub(super) len: usize,
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
        let elems = shape
            .kv_step_elems()
            .checked_mul(capacity)
            .and_then(|e| e.checked_add(SLACK_ROWS * shape.head_dim));
        let Some(elems) = elems.filter(|e| {
            e.checked_mul(dtype.bytes())
                .is_some_and(|b| b <= u32::MAX as usize)
        }) else {
            return Err(Error::InvalidArgument(format!(
                "a KV cache of {capacity} positions for {shape:?} exceeds 4 GiB per buffer"
            )));
        };
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
    pub(super) fn check_room(&self) -> Result<()> {
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
    /// do not fit in the capacity, or a slice has the wrong length; [`Error::InvalidArgument`] for a
    /// value the cache cannot hold (see [`check_storable`]); nothing is written then. The buffer's
    /// write errors.
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
        check_storable("written k", k, self.dtype())?;
        check_storable("written v", v, self.dtype())?;
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
    pub(super) fn write_rows(&self, pos: usize, rows: usize, k: &[f32], v: &[f32]) -> Result<()> {
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

    /// The filled positions as f32 (f16 widened exactly): K and V, each
    /// `[batch][kv_head][len][head_dim]`. One read per (batch, KV head); waits for earlier launches.
    ///
    /// Errors: the buffers' read errors.
    pub fn read(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        let d = self.shape.head_dim;
        let run = self.len * d;
        let heads = self.shape.batch * self.shape.kv_heads;
        let (mut k, mut v) = (vec![0f32; heads * run], vec![0f32; heads * run]);
        for bh in 0..heads {
            let at = bh * self.capacity * d;
            let (ko, vo) = (&mut k[bh * run..][..run], &mut v[bh * run..][..run]);
            match &self.store {
                KvStore::F32 { k, v } => {
                    k.read_at(at, ko)?;
                    v.read_at(at, vo)?;
                }
                KvStore::F16 { k, v } => {
                    let mut bits = vec![0u16; run];
                    k.read_at(at, &mut bits)?;
                    widen(&bits, ko);
                    v.read_at(at, &mut bits)?;
                    widen(&bits, vo);
                }
            }
        }
        Ok((k, v))
    }

    /// Appends one position: `k_new` and `v_new` are `[batch][kv_head][head_dim]`. Writes that
    /// position in place (O(1); the past is not touched) and increments [`KvCache::len`].
    ///
    /// Errors: [`Error::Size`] when a slice has the wrong length or the cache is full;
    /// [`Error::InvalidArgument`] for a value the cache cannot hold (see [`check_storable`]); nothing
    /// is written then. The buffer's write errors.
    pub fn append(&mut self, k_new: &[f32], v_new: &[f32]) -> Result<()> {
        let n = self.shape.kv_step_elems();
        check_len("appended k", k_new.len(), n)?;
        check_len("appended v", v_new.len(), n)?;
        check_storable("appended k", k_new, self.dtype())?;
        check_storable("appended v", v_new, self.dtype())?;
        self.check_room()?;
        self.write_rows(self.len, 1, k_new, v_new)?;
        self.len += 1;
        Ok(())
    }

    /// Replaces the contents with `len` positions: `k` and `v` are `[batch][kv_head][len][head_dim]`.
    /// Used for a prompt's K and V and for a static cross-attention set.
    ///
    /// Errors: [`Error::Size`] when `len` exceeds the capacity or a slice has the wrong length;
    /// [`Error::InvalidArgument`] for a value the cache cannot hold (see [`check_storable`]). Nothing
    /// is written then.
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
        check_storable("filled k", k, self.dtype())?;
        check_storable("filled v", v, self.dtype())?;
        self.write_rows(0, len, k, v)?;
        self.len = len;
        Ok(())
    }
}

/// fp16's largest finite value. A float of magnitude below 65520 rounds to at most it; from 65520
/// on it rounds to infinity.
pub const F16_MAX: f32 = 65504.0;

/// Checks that a cache of `dtype` can hold every value of `x` (named `what` in the error): finite
/// values, and for [`KvDtype::F16`] only those that round to a finite fp16 (magnitude below 65520;
/// the largest, [`F16_MAX`], is 65504). Host data bound for a cache ([`KvCache::write`],
/// [`KvCache::append`], [`KvCache::fill`], [`Attention::decode_step`](crate::Attention::decode_step),
/// [`MultiHeadAttention::import_cache`](crate::MultiHeadAttention::import_cache)) passes here first.
///
/// Errors: [`Error::InvalidArgument`] naming the first value that fails, its index, and the range
/// accepted.
pub fn check_storable(what: &str, x: &[f32], dtype: KvDtype) -> Result<()> {
    for (i, &v) in x.iter().enumerate() {
        if !v.is_finite() {
            return Err(Error::InvalidArgument(format!(
                "{what}[{i}] is {v}; cache values must be finite"
            )));
        }
        if dtype == KvDtype::F16 && half::f16::from_f32(v).is_infinite() {
            return Err(Error::InvalidArgument(format!(
                "{what}[{i}] is {v}, outside the range of an fp16 cache: fp16 holds magnitudes up \
                 to {F16_MAX} (values below 65520 round to it); store K/V as f32 for larger values"
            )));
        }
    }
    Ok(())
}

fn widen(bits: &[u16], out: &mut [f32]) {
    for (o, &b) in out.iter_mut().zip(bits) {
        *o = half::f16::from_bits(b).to_f32();
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
