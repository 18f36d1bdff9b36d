//! [`Tensor`]: a device-resident array of fp16 or f32 with a shape, over a kpc [`Buffer`], the unit
//! the layers' device calls read and write without a host copy or a host wait.

use kpc::{Buffer, BufferArg, Context};
use kpc::{Error, Result};

/// The element type of a [`Tensor`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE half floats (stored as their bits).
    F16,
    /// 32-bit floats.
    F32,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Dtype::F16 => 2,
            Dtype::F32 => 4,
        }
    }
}

#[derive(Clone)]
enum Data {
    F16(Buffer<u16>),
    F32(Buffer<f32>),
}

/// A device array: a shape, an element type, and a buffer on one context holding at least that
/// many elements (row-major, the last dimension contiguous). Cloning shares the buffer.
///
/// Reads and writes from the host ([`Tensor::read_f32`], [`Tensor::write_f32`]) are synchronous and
/// ordered after every launch submitted before them; the layers' device calls only submit.
/// An fp16 tensor holds an even number of elements: kernels move fp16 in pairs.
#[derive(Clone)]
pub struct Tensor {
    data: Data,
    shape: Vec<usize>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape)
            .finish()
    }
}

fn elements(shape: &[usize], dtype: Dtype) -> Result<usize> {
    if shape.is_empty() || shape.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "tensor shape {shape:?}: a tensor has at least one dimension and no dimension is 0"
        )));
    }
    let n = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::Size {
            what: "tensor".into(),
            got: format!("shape {shape:?}"),
            expected: "fewer than 2^64 elements".into(),
        })?;
    if dtype == Dtype::F16 && n % 2 != 0 {
        return Err(Error::InvalidArgument(format!(
            "fp16 tensor shape {shape:?} holds {n} elements; fp16 tensors hold an even number \
             (kernels move fp16 in pairs): use f32 or pad a dimension"
        )));
    }
    Ok(n)
}

impl Tensor {
    /// A tensor of `shape` and `dtype` on `ctx` (contents undefined until written).
    ///
    /// Errors: [`Error::InvalidArgument`] for an empty shape, a zero dimension, or an fp16 tensor
    /// of an odd number of elements; allocation errors.
    pub fn new(ctx: &Context, shape: &[usize], dtype: Dtype) -> Result<Tensor> {
        let n = elements(shape, dtype)?;
        let data = match dtype {
            Dtype::F16 => Data::F16(ctx.buffer(n)?),
            Dtype::F32 => Data::F32(ctx.buffer(n)?),
        };
        Ok(Tensor {
            data,
            shape: shape.to_vec(),
        })
    }

    /// A tensor of `shape` and `dtype` on `ctx` holding `data` (rounded to nearest even for fp16).
    ///
    /// Errors: as [`Tensor::new`] and [`Tensor::write_f32`].
    pub fn from_f32(ctx: &Context, shape: &[usize], dtype: Dtype, data: &[f32]) -> Result<Tensor> {
        elements(shape, dtype)?;
        crate::check_len("tensor data", data.len(), shape.iter().product())?;
        if dtype == Dtype::F16 {
            check_f16("tensor data", data)?;
        }
        let t = Tensor::new(ctx, shape, dtype)?;
        t.write_f32(data)?;
        Ok(t)
    }

    /// An f32 tensor of `shape` over `buffer`, which holds at least its elements (the first ones
    /// are the tensor's): an engine's own buffer, or an imported one.
    ///
    /// Errors: as [`Tensor::new`]; [`Error::Size`] for a buffer smaller than the shape.
    pub fn from_buffer_f32(buffer: Buffer<f32>, shape: &[usize]) -> Result<Tensor> {
        Tensor::wrap(Data::F32(buffer), shape)
    }

    /// An fp16 tensor of `shape` over `buffer` (fp16 bits), which holds at least its elements.
    ///
    /// Errors: as [`Tensor::from_buffer_f32`].
    pub fn from_buffer_f16(buffer: Buffer<u16>, shape: &[usize]) -> Result<Tensor> {
        Tensor::wrap(Data::F16(buffer), shape)
    }

    fn wrap(data: Data, shape: &[usize]) -> Result<Tensor> {
        let t = Tensor {
            data,
            shape: shape.to_vec(),
        };
        let n = elements(shape, t.dtype())?;
        let have = t.buffer_len();
        if have < n {
            return Err(Error::Size {
                what: format!("buffer for a {:?} tensor of shape {shape:?}", t.dtype()),
                got: format!("{have} elements"),
                expected: format!("at least {n} elements"),
            });
        }
        Ok(t)
    }

    /// The same buffer seen with another shape of the same number of elements.
    ///
    /// Errors: [`Error::Size`] when the element counts differ; as [`Tensor::new`] for a bad shape.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let n = elements(shape, self.dtype())?;
        crate::check_len("reshaped tensor", n, self.len())?;
        Ok(Tensor {
            data: self.data.clone(),
            shape: shape.to_vec(),
        })
    }

    /// Its element type.
    pub fn dtype(&self) -> Dtype {
        match self.data {
            Data::F16(_) => Dtype::F16,
            Data::F32(_) => Dtype::F32,
        }
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its elements: the product of the shape.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Always false: a tensor has at least one element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn buffer_len(&self) -> usize {
        match &self.data {
            Data::F16(b) => b.len(),
            Data::F32(b) => b.len(),
        }
    }

    /// Its buffer, as a kernel argument.
    pub fn buffer(&self) -> &dyn BufferArg {
        match &self.data {
            Data::F16(b) => b,
            Data::F32(b) => b,
        }
    }

    /// Its buffer, where the tensor is f32.
    pub fn as_f32(&self) -> Option<&Buffer<f32>> {
        match &self.data {
            Data::F32(b) => Some(b),
            Data::F16(_) => None,
        }
    }

    /// Its buffer of fp16 bits, where the tensor is fp16.
    pub fn as_f16(&self) -> Option<&Buffer<u16>> {
        match &self.data {
            Data::F16(b) => Some(b),
            Data::F32(_) => None,
        }
    }

    /// Whether it lives on `ctx` (a clone of the context its buffer was made on).
    pub fn is_on(&self, ctx: &Context) -> bool {
        ctx.owns(self.buffer())
    }

    /// Its elements as f32 (fp16 widened exactly), after every launch submitted before.
    pub fn read_f32(&self) -> Result<Vec<f32>> {
        let n = self.len();
        match &self.data {
            Data::F32(b) => {
                let mut out = vec![0.0; n];
                b.read_at(0, &mut out)?;
                Ok(out)
            }
            Data::F16(b) => {
                let mut bits = vec![0u16; n];
                b.read_at(0, &mut bits)?;
                Ok(bits
                    .into_iter()
                    .map(|h| half::f16::from_bits(h).to_f32())
                    .collect())
            }
        }
    }

    /// Overwrites its elements with `data`, rounded to nearest even for fp16.
    ///
    /// Errors: [`Error::Size`] unless `data` has [`Tensor::len`] elements; for fp16,
    /// [`Error::InvalidArgument`] naming a value outside fp16's finite range (nothing is written
    /// then).
    pub fn write_f32(&self, data: &[f32]) -> Result<()> {
        crate::check_len("tensor write", data.len(), self.len())?;
        match &self.data {
            Data::F32(b) => b.write_at(0, data),
            Data::F16(b) => {
                check_f16("tensor write", data)?;
                let bits: Vec<u16> = data
                    .iter()
                    .map(|&v| half::f16::from_f32(v).to_bits())
                    .collect();
                b.write_at(0, &bits)
            }
        }
    }

    /// Checks that the tensor can be `what` of a call on `ctx`: on that context, of `dtype` where
    /// given, and of `shape`.
    pub(crate) fn check(
        &self,
        what: &str,
        ctx: &Context,
        dtypes: &[Dtype],
        shape: &[usize],
    ) -> Result<()> {
        if !self.is_on(ctx) {
            return Err(Error::InvalidArgument(format!(
                "{what}: the tensor belongs to another context; pass a tensor made on the layer's \
                 context"
            )));
        }
        if !dtypes.contains(&self.dtype()) {
            return Err(Error::InvalidArgument(format!(
                "{what}: a {:?} tensor; this call takes {}",
                self.dtype(),
                dtypes
                    .iter()
                    .map(|d| format!("{d:?}"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            )));
        }
        if self.shape != shape {
            return Err(Error::Size {
                what: what.to_string(),
                got: format!("shape {:?}", self.shape),
                expected: format!("shape {shape:?}"),
            });
        }
        Ok(())
    }
}

fn check_f16(what: &str, data: &[f32]) -> Result<()> {
    match data
        .iter()
        .position(|&v| !v.is_nan() && half::f16::from_f32(v).is_infinite() && v.is_finite())
    {
        None => Ok(()),
        Some(i) => Err(Error::InvalidArgument(format!(
            "{what}[{i}] is {}, outside fp16's range (magnitudes up to {}); use an f32 tensor",
            data[i],
            crate::F16_MAX
        ))),
    }
}
