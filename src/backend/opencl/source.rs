//! OpenCL C device images: the specialization constants an image declares, and the build options
//! that carry their values.
//!
//! OpenCL C has no specialization constants. kpc maps each one onto a preprocessor definition: the
//! image declares, in a comment line of its own, which spec-constant id is which macro name,
//!
//! ```c
//! // kpc-spec-constant 0 LOCAL_SIZE
//! // kpc-spec-constant 1 BIAS
//! #ifndef LOCAL_SIZE
//! #define LOCAL_SIZE 64
//! #endif
//! ```
//!
//! and a build with constant 1 set to 3 passes `-D BIAS=3`. Constants left unset keep the source's
//! own default. Ids are what a caller sets (the same ids as the SPIR-V twin of the kernel), so one
//! `SpecConstants` value means the same thing on both backends. Everything else about a kernel (its
//! parameters, its workgroup size) is reflected from the built program, never declared by hand.

use crate::backend::DeviceImage;
use crate::cache::{BuildOptions, SpecConstants, SpecValue};
use crate::error::{Error, Result};

/// The marker that starts a spec-constant declaration (after `//` and blanks).
pub const SPEC_CONSTANT_MARKER: &str = "kpc-spec-constant";

/// The build option that makes drivers keep kernel argument names and qualifiers, which kpc
/// reflects parameters from (clGetKernelArgInfo).
pub const ARG_INFO_OPTION: &str = "-cl-kernel-arg-info";

/// One declared specialization constant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecDecl {
    /// The id callers set.
    pub id: u32,
    /// The macro it defines.
    pub name: String,
    /// Its declared type (`bool`, `i32`, `u32`, `f32`, `i64`, `u64`, `f64`), when the declaration
    /// gives one: a value of another type is refused, as Vulkan refuses it from the SPIR-V's own
    /// declaration. `None`: any value is passed as its C literal.
    pub ty: Option<&'static str>,
}

/// The types a declaration may give.
const SPEC_TYPES: [&str; 7] = ["bool", "i32", "u32", "f32", "i64", "u64", "f64"];

/// Whether `value` fits the declared type `ty` (integers may be given signed or unsigned, as on
/// Vulkan).
fn spec_fits(ty: &str, value: &SpecValue) -> bool {
    let given = value.type_name();
    given == ty
        || matches!(
            (ty, given),
            ("i32", "u32") | ("u32", "i32") | ("i64", "u64") | ("u64", "i64")
        )
}

/// An OpenCL C image's text and its declared specialization constants.
#[derive(Debug, Clone)]
pub struct OpenClSource<'a> {
    /// The source text.
    pub text: &'a str,
    /// Declared spec constants, in source order.
    pub spec: Vec<SpecDecl>,
}

fn bad_image(image: &DeviceImage, message: String) -> Error {
    Error::InvalidArgument(format!("OpenCL image {:?}: {message}", image.name()))
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

impl<'a> OpenClSource<'a> {
    /// Reads `image` as OpenCL C.
    ///
    /// Errors: [`Error::InvalidArgument`] when the image is not OpenCL C, is not UTF-8, holds a NUL
    /// byte (a driver would stop reading there), or has a malformed or duplicate spec-constant
    /// declaration.
    pub fn parse(image: &'a DeviceImage) -> Result<Self> {
        if image.format() != crate::backend::ImageFormat::OpenClC {
            return Err(bad_image(
                image,
                format!(
                    "holds {}; an OpenCL context builds OpenCL C source ({})",
                    image.format(),
                    crate::backend::ImageFormat::OpenClC.made_by()
                ),
            ));
        }
        let text = std::str::from_utf8(image.bytes())
            .map_err(|e| bad_image(image, format!("source is not UTF-8: {e}")))?;
        if let Some(at) = text.find('\0') {
            return Err(bad_image(image, format!("source holds a NUL byte at {at}")));
        }
        let mut spec: Vec<SpecDecl> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let Some(rest) = line.trim_start().strip_prefix("//") else {
                continue;
            };
            let Some(decl) = rest.trim_start().strip_prefix(SPEC_CONSTANT_MARKER) else {
                continue;
            };
            let malformed = || {
                bad_image(
                    image,
                    format!(
                        "line {}: expected `// {SPEC_CONSTANT_MARKER} <id> <NAME> [<TYPE>]` with \
                         TYPE one of bool, i32, u32, f32, i64, u64, f64, got {:?}",
                        n + 1,
                        line.trim()
                    ),
                )
            };
            let mut words = decl.split_whitespace();
            let (Some(id), Some(name), ty, None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(malformed());
            };
            let ty = match ty {
                None => None,
                Some(t) => Some(*SPEC_TYPES.iter().find(|k| **k == t).ok_or_else(malformed)?),
            };
            let id: u32 = id.parse().map_err(|_| malformed())?;
            if !is_identifier(name) {
                return Err(malformed());
            }
            if let Some(d) = spec.iter().find(|d| d.id == id || d.name == name) {
                return Err(bad_image(
                    image,
                    format!(
                        "line {}: spec constant {id} {name} clashes with {} {}",
                        n + 1,
                        d.id,
                        d.name
                    ),
                ));
            }
            spec.push(SpecDecl {
                id,
                name: name.to_string(),
                ty,
            });
        }
        Ok(OpenClSource { text, spec })
    }

    /// The complete option string for clBuildProgram: kernel-argument reflection, one `-D` per set
    /// spec constant (in id order), then the caller's options.
    ///
    /// Errors: [`Error::InvalidArgument`] for a spec-constant id the image does not declare (the
    /// message lists the declared ones), or options holding a NUL byte.
    pub fn build_options(
        &self,
        image: &DeviceImage,
        spec: &SpecConstants,
        options: &BuildOptions,
    ) -> Result<String> {
        let mut out = String::from(ARG_INFO_OPTION);
        for (id, value) in spec.iter() {
            let Some(d) = self.spec.iter().find(|d| d.id == *id) else {
                let declared: Vec<String> = self
                    .spec
                    .iter()
                    .map(|d| format!("{} {}", d.id, d.name))
                    .collect();
                return Err(bad_image(
                    image,
                    format!(
                        "no spec constant with id {id}; it declares: {}",
                        if declared.is_empty() {
                            "none".to_string()
                        } else {
                            declared.join(", ")
                        }
                    ),
                ));
            };
            if let Some(ty) = d.ty.filter(|ty| !spec_fits(ty, value)) {
                return Err(Error::InvalidArgument(format!(
                    "specialization constant {id} ({}) of image {:?} is {ty}, but {value} was given; \
                     pass a {ty} value (integers may be signed or unsigned)",
                    d.name,
                    image.name()
                )));
            }
            out.push_str(" -D ");
            out.push_str(&d.name);
            out.push('=');
            out.push_str(&c_literal(value));
        }
        if options.as_str().contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "build options for {:?} hold a NUL byte",
                image.name()
            )));
        }
        if !options.as_str().is_empty() {
            out.push(' ');
            out.push_str(options.as_str());
        }
        Ok(out)
    }
}

/// `value` as an OpenCL C expression without blanks (drivers split options at whitespace), exact for
/// every value: floats print with enough digits to round-trip, non-finite floats use the OpenCL C
/// macros, and the most negative integers are written so that no literal overflows.
pub fn c_literal(value: &SpecValue) -> String {
    match *value {
        SpecValue::F32Bits(bits) => {
            let v = f32::from_bits(bits);
            if v.is_nan() {
                "NAN".into()
            } else if v.is_infinite() {
                if v > 0.0 { "INFINITY" } else { "(-INFINITY)" }.into()
            } else {
                // Debug prints the shortest text that reads back as the same f32.
                let t = format!("{v:?}");
                if t.contains(['.', 'e']) {
                    format!("{t}f")
                } else {
                    format!("{t}.0f")
                }
            }
        }
        SpecValue::F64Bits(bits) => {
            let v = f64::from_bits(bits);
            if v.is_nan() {
                "((double)NAN)".into()
            } else if v.is_infinite() {
                if v > 0.0 {
                    "((double)INFINITY)"
                } else {
                    "(-(double)INFINITY)"
                }
                .into()
            } else {
                let t = format!("{v:?}");
                if t.contains(['.', 'e']) {
                    t
                } else {
                    format!("{t}.0")
                }
            }
        }
        SpecValue::I32(i32::MIN) => "(-2147483647-1)".into(),
        SpecValue::I64(i64::MIN) => "(-9223372036854775807L-1)".into(),
        SpecValue::I32(v) if v < 0 => format!("({v})"),
        SpecValue::I64(v) if v < 0 => format!("({v}L)"),
        _ => value.to_c_literal(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ImageFormat;

    fn image(src: &str) -> DeviceImage {
        DeviceImage::new("t", ImageFormat::OpenClC, src.as_bytes().to_vec())
    }

    #[test]
    fn a_declared_type_refuses_values_of_another() {
        let img = image(
            "// kpc-spec-constant 1 BIAS i32\n// kpc-spec-constant 2 ANY\nkernel void k() {}\n",
        );
        let src = OpenClSource::parse(&img).unwrap();
        let opts = BuildOptions::default();
        let e = src
            .build_options(
                &img,
                &SpecConstants::new().with(1, SpecValue::f32(1.0)),
                &opts,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("is i32, but f32 1 was given"), "{e}");
        // Signed or unsigned integers of the width fit; an undeclared type takes anything.
        let ok = SpecConstants::new()
            .with(1, SpecValue::U32(3))
            .with(2, SpecValue::f32(0.5));
        assert!(src.build_options(&img, &ok, &opts).is_ok());
        // An unknown type is a malformed declaration.
        let bad = image("// kpc-spec-constant 1 BIAS int\nkernel void k() {}\n");
        let e = OpenClSource::parse(&bad).err().unwrap().to_string();
        assert!(e.contains("TYPE one of bool"), "{e}");
    }

    #[test]
    fn another_backends_image_says_what_to_use() {
        let spirv = DeviceImage::new("s", ImageFormat::SpirV, vec![0u8; 20]);
        let e = OpenClSource::parse(&spirv).err().unwrap().to_string();
        assert!(
            e.contains("holds SPIR-V; an OpenCL context builds OpenCL C source")
                && e.contains("kpc::kernels::opencl_image")
                && e.contains("DeviceImage::opencl_c"),
            "{e}"
        );
        // No Rust debug or variant names in the message.
        assert!(!e.contains("OpenClC") && !e.contains("SpirV"), "{e}");
    }

    #[test]
    fn declarations_and_options() {
        let img = image(
            "// kpc-spec-constant 0 LOCAL_SIZE\n  //kpc-spec-constant 3 BIAS\nkernel void k() {}\n",
        );
        let src = OpenClSource::parse(&img).unwrap();
        assert_eq!(src.spec.len(), 2);
        let spec = SpecConstants::new()
            .with(3, SpecValue::I32(-2))
            .with(0, SpecValue::U32(128));
        let opts = src
            .build_options(&img, &spec, &BuildOptions::new(" -cl-fast-relaxed-math "))
            .unwrap();
        assert_eq!(
            opts,
            "-cl-kernel-arg-info -D LOCAL_SIZE=128u -D BIAS=(-2) -cl-fast-relaxed-math"
        );
        let e = src
            .build_options(
                &img,
                &SpecConstants::new().with(7, SpecValue::I32(1)),
                &BuildOptions::default(),
            )
            .unwrap_err();
        assert!(e.to_string().contains("0 LOCAL_SIZE, 3 BIAS"), "{e}");
    }

    #[test]
    fn malformed_declarations_are_errors() {
        for src in [
            "// kpc-spec-constant 0\n",
            "// kpc-spec-constant x NAME\n",
            "// kpc-spec-constant 0 1NAME\n",
            "// kpc-spec-constant 0 A B\n",
            "// kpc-spec-constant 0 A\n// kpc-spec-constant 0 B\n",
            "// kpc-spec-constant 0 A\n// kpc-spec-constant 1 A\n",
            "kernel void k() {}\0",
        ] {
            assert!(OpenClSource::parse(&image(src)).is_err(), "{src:?}");
        }
        let spirv = DeviceImage::new("s", ImageFormat::SpirV, vec![0u8; 4]);
        assert!(OpenClSource::parse(&spirv).is_err());
        let not_utf8 = DeviceImage::new("u", ImageFormat::OpenClC, vec![0xff, 0xfe]);
        assert!(OpenClSource::parse(&not_utf8).is_err());
    }

    #[test]
    fn literals_have_no_blanks_and_round_trip() {
        let cases = [
            (SpecValue::Bool(true), "1"),
            (SpecValue::U32(7), "7u"),
            (SpecValue::I32(i32::MIN), "(-2147483647-1)"),
            (SpecValue::I64(-3), "(-3L)"),
            (SpecValue::f32(1.0), "1.0f"),
            (SpecValue::f32(1e-7), "1e-7f"),
            (SpecValue::f32(f32::NEG_INFINITY), "(-INFINITY)"),
            (SpecValue::F64Bits(2.5f64.to_bits()), "2.5"),
        ];
        for (v, want) in cases {
            let got = c_literal(&v);
            assert_eq!(got, want);
            assert!(!got.contains(char::is_whitespace));
        }
    }
}
