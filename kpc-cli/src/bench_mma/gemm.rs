//! `kpc bench-mma`'s `gemm` section: the projection GEMMs (`mha_gemm_wide` per tile, activation
//! type and accumulator, and `mha_gemm_coop`) timed at each shape beside the ceiling the `peak`
//! section measured, and checked against a float64 reference.

use std::time::Duration;

use kpc::BufferArg;
use kpc::SpecConstants;
use kpc::{Buffer, Context, Error, Event, Kernel};
use kpc_attention::mha::gemm::{
    GemmAccumulator, GemmShape, GemmTiles, KERNEL, SWEEP_TILES, WideGemm,
};

use super::{
    Args, Peaks, Rng, acc_name, f16_bits, f16_value, kernel, launch_n, registers, time_after,
};

/// One GEMM to time.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Coop,
    Wide {
        tiles: GemmTiles,
        a_f16: bool,
        acc: GemmAccumulator,
    },
}

impl Case {
    fn parse(text: &str) -> kpc::Result<Case> {
        if text == "coop" {
            return Ok(Case::Coop);
        }
        let bad = || {
            Error::InvalidArgument(format!(
                "GEMM case {text:?}: expected `coop` or TILE:a16|a32:acc32|acc16"
            ))
        };
        let mut parts = text.split(':');
        let tiles = GemmTiles::parse(parts.next().ok_or_else(bad)?)?;
        let a_f16 = match parts.next() {
            Some("a16") | None => true,
            Some("a32") => false,
            Some(_) => return Err(bad()),
        };
        let acc = match parts.next() {
            Some("acc32") | None => GemmAccumulator::F32,
            Some("acc16") => GemmAccumulator::F16,
            Some(_) => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Case::Wide { tiles, a_f16, acc })
    }

    fn defaults() -> Vec<Case> {
        let mut v = vec![Case::Coop];
        let t = |s: &str| GemmTiles::parse(s).expect("a valid built-in tile");
        v.extend(SWEEP_TILES.iter().map(|&tiles| Case::Wide {
            tiles,
            a_f16: true,
            acc: GemmAccumulator::F32,
        }));
        for s in ["128x256x32/2x4", "128x256x32/2x4e", "128x128x64/2x4a2"] {
            v.push(Case::Wide {
                tiles: t(s),
                a_f16: false,
                acc: GemmAccumulator::F32,
            });
        }
        // fp16 sums leave registers for 128 x 64 of C per subgroup (256 x 256).
        for s in [
            "256x256x32/2x4",
            "256x256x32/2x4e",
            "128x256x32/2x4",
            "128x128x64/2x4a2",
        ] {
            v.push(Case::Wide {
                tiles: t(s),
                a_f16: true,
                acc: GemmAccumulator::F16,
            });
        }
        v
    }

    fn label(&self) -> String {
        match self {
            Case::Coop => "kernel=mha_gemm_coop tiles=128x128x32/2x4 a=f32 acc=f32".into(),
            Case::Wide { tiles, a_f16, acc } => format!(
                "kernel={KERNEL} tiles={tiles} a={} acc={}",
                if *a_f16 { "f16" } else { "f32" },
                acc_name(*acc)
            ),
        }
    }

    fn acc(&self) -> GemmAccumulator {
        match self {
            Case::Coop => GemmAccumulator::F32,
            Case::Wide { acc, .. } => *acc,
        }
    }
}

fn parse_shape(text: &str) -> kpc::Result<(usize, usize, usize)> {
    let v: Vec<usize> = text
        .split('x')
        .map(|n| n.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| Error::InvalidArgument(format!("shape {text:?}: expected MxNxK")))?;
    match v.as_slice() {
        &[m, n, k] if m > 0 && n > 0 && k > 0 => Ok((m, n, k)),
        _ => Err(Error::InvalidArgument(format!(
            "shape {text:?}: expected MxNxK, each at least 1"
        ))),
    }
}

/// One shape's inputs on the host and the device.
struct Inputs {
    m: usize,
    n: usize,
    k: usize,
    /// A as fp16 bits ([m][k]).
    a: Vec<u16>,
    a16: Buffer<u16>,
    a32: Buffer<f32>,
    /// W as fp16 bits ([n][k]).
    w: Vec<u16>,
    wd: Buffer<u32>,
    bias: Vec<f32>,
    biasd: Buffer<f32>,
    c: Buffer<f32>,
}

impl Inputs {
    fn new(ctx: &Context, m: usize, n: usize, k: usize, seed: u64) -> kpc::Result<Inputs> {
        let mut rng = Rng(seed | 1);
        let a: Vec<u16> = (0..m * k).map(|_| f16_bits(rng.unit())).collect();
        // Weights at a layer's scale (1 / sqrt(K)), so that outputs are O(1).
        let s = 1.0 / (k as f32).sqrt();
        let w: Vec<u16> = (0..n * k).map(|_| f16_bits(rng.unit() * s)).collect();
        let bias: Vec<f32> = (0..n).map(|_| rng.unit() * 0.1).collect();
        let a32: Vec<f32> = a.iter().map(|&b| f16_value(b)).collect();
        let pairs: Vec<u32> = w
            .chunks(2)
            .map(|c| c[0] as u32 | (c.get(1).copied().unwrap_or(0) as u32) << 16)
            .collect();
        Ok(Inputs {
            m,
            n,
            k,
            a16: ctx.buffer_from(&a)?,
            a32: ctx.buffer_from(&a32)?,
            a,
            wd: ctx.buffer_from(&pairs)?,
            w,
            biasd: ctx.buffer_from(&bias)?,
            bias,
            c: ctx.buffer::<f32>(m * n)?,
        })
    }

    /// Row `r` of A W^T + bias in float64.
    fn reference_row(&self, r: usize) -> Vec<f64> {
        let a: Vec<f64> = self.a[r * self.k..(r + 1) * self.k]
            .iter()
            .map(|&b| f16_value(b) as f64)
            .collect();
        (0..self.n)
            .map(|j| {
                let w = &self.w[j * self.k..(j + 1) * self.k];
                let dot: f64 = a.iter().zip(w).map(|(x, &y)| x * f16_value(y) as f64).sum();
                dot + self.bias[j] as f64
            })
            .collect()
    }

    fn shape(&self) -> GemmShape {
        GemmShape::plain(self.m, self.n, self.k)
    }
}

/// A built case, ready to launch.
enum Built {
    Coop(Kernel),
    Wide(WideGemm),
}

impl Built {
    fn new(ctx: &Context, case: &Case) -> kpc::Result<Built> {
        Ok(match case {
            Case::Coop => Built::Coop(kernel(ctx, "mha_gemm_coop", &SpecConstants::new())?),
            Case::Wide { tiles, a_f16, acc } => {
                Built::Wide(WideGemm::new(ctx, *tiles, *a_f16, *acc)?)
            }
        })
    }

    fn kernel(&self) -> &Kernel {
        match self {
            Built::Coop(k) => k,
            Built::Wide(g) => g.kernel(),
        }
    }

    fn label(&self, case: &Case) -> String {
        match (self, case) {
            (Built::Wide(g), Case::Wide { .. }) => Case::Wide {
                tiles: g.tiles(),
                a_f16: g.a_f16(),
                acc: g.accumulator(),
            }
            .label(),
            _ => case.label(),
        }
    }

    fn submit(&self, ctx: &Context, x: &Inputs, n: usize) -> kpc::Result<Event> {
        let s = x.shape();
        match self {
            Built::Coop(k) => {
                let push = s.push_constants();
                let bufs: [&dyn BufferArg; 6] = [&x.a32, &x.wd, &x.biasd, &x.c, &x.c, &x.c];
                let groups = [x.n.div_ceil(128) as u32, x.m.div_ceil(128) as u32, 1];
                launch_n(ctx, k, groups, &bufs, &push, n)
            }
            Built::Wide(g) => {
                let a: &dyn BufferArg = if g.a_f16() { &x.a16 } else { &x.a32 };
                g.launch(ctx, a, &x.wd, &x.biasd, [&x.c; 3], &s, n)
            }
        }
    }
}

/// Relative 2-norm error of the sampled rows (and whether every element of them is finite).
fn sampled_error(x: &Inputs, rows: &[usize], refs: &[Vec<f64>]) -> kpc::Result<(f64, bool)> {
    let (mut num, mut den, mut finite) = (0.0f64, 0.0f64, true);
    let mut got = vec![0f32; x.n];
    for (&r, want) in rows.iter().zip(refs) {
        x.c.read_at(r * x.n, &mut got)?;
        for (&g, &w) in got.iter().zip(want) {
            finite &= g.is_finite();
            num += (g as f64 - w) * (g as f64 - w);
            den += w * w;
        }
    }
    Ok(((num / den.max(1e-300)).sqrt(), finite))
}

/// The tolerance a case is held to: fp32 sums of exact fp16 products, or fp16 sums.
fn tolerance(acc: GemmAccumulator) -> f64 {
    match acc {
        GemmAccumulator::F32 => 1e-4,
        GemmAccumulator::F16 => 3e-2,
    }
}

pub(super) fn gemm(ctx: &Context, args: &Args, peaks: &Peaks) -> kpc::Result<bool> {
    let cases = if args.gemm.is_empty() {
        Case::defaults()
    } else {
        args.gemm
            .iter()
            .map(|c| Case::parse(c))
            .collect::<kpc::Result<Vec<_>>>()?
    };
    let mut all_ok = true;
    let mut built = Vec::new();
    for case in &cases {
        match Built::new(ctx, case) {
            Ok(b) => {
                outln!(
                    "bench: kind=gemm-kernel {}{}",
                    b.label(case),
                    registers(b.kernel())
                );
                built.push((*case, b));
            }
            Err(e) => outln!("bench: kind=gemm-kernel {} refused: {e}", case.label()),
        }
    }
    // Every element, poisoned first, at the edge shapes.
    for text in &args.check_shapes {
        let (m, n, k) = parse_shape(text)?;
        let x = Inputs::new(ctx, m, n, k, (m * 31 + n * 7 + k) as u64)?;
        let refs: Vec<Vec<f64>> = (0..m).map(|r| x.reference_row(r)).collect();
        for (case, b) in &built {
            x.c.write(&vec![f32::NAN; m * n])?;
            b.submit(ctx, &x, 1)?.wait()?;
            let rows: Vec<usize> = (0..m).collect();
            let (err, finite) = sampled_error(&x, &rows, &refs)?;
            let ok = finite && err <= tolerance(case.acc());
            all_ok &= ok;
            outln!(
                "check: m={m} n={n} k={k} {} err={err:.2e} {}",
                b.label(case),
                if ok { "ok" } else { "FAIL" }
            );
        }
    }
    for text in &args.shapes {
        let (m, n, k) = parse_shape(text)?;
        let x = Inputs::new(ctx, m, n, k, (m * 31 + n * 7 + k) as u64)?;
        let rows = [0, 1, m / 3, m / 2, (2 * m) / 3, m - 2, m - 1]
            .into_iter()
            .filter(|&r| r < m)
            .collect::<Vec<_>>();
        let refs: Vec<Vec<f64>> = rows.iter().map(|&r| x.reference_row(r)).collect();
        let flops = x.shape().flops();
        let poison = vec![f32::NAN; m * n];
        for (i, (case, b)) in built.iter().enumerate() {
            x.c.write(&poison)?;
            // The shape's inputs and references were made on the host meanwhile: warm longer.
            let warm = Duration::from_millis(if i == 0 { 500 } else { 100 });
            let t = time_after(warm, args.runs, &|r| b.submit(ctx, &x, r))?;
            let (err, finite) = sampled_error(&x, &rows, &refs)?;
            let ok = finite && err <= tolerance(case.acc());
            all_ok &= ok;
            let tflops = flops / t.as_secs_f64() / 1e12;
            let peak = match case.acc() {
                GemmAccumulator::F32 => peaks.f32,
                GemmAccumulator::F16 => peaks.f16,
            };
            let of_peak = if peak > 0.0 {
                format!(" of_peak={:.3}", tflops / peak)
            } else {
                String::new()
            };
            outln!(
                "bench: kind=gemm m={m} n={n} k={k} {} us={:.1} tflops={tflops:.1}{of_peak} err={err:.2e} {}",
                b.label(case),
                t.as_secs_f64() * 1e6,
                if ok { "ok" } else { "FAIL" }
            );
        }
    }
    Ok(all_ok)
}
