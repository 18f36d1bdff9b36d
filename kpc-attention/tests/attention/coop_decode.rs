//! The cooperative-matrix decode case of tests/attention.rs: asked for where the device has no
//! such matrices (lavapipe, PoCL) it is a typed error naming what is missing, and Auto never picks
//! it anywhere; where the device has them, it matches the reference.

use kpc::{Context, Error};
use kpc_attention::{AttentionOptions, DecodeKernel, KvDtype};

use super::prefill::coop_capable;
use super::{decode_case, shape};

/// See the module: f32 K/V, 16 query heads per KV head and `decode_spread` are typed errors
/// everywhere; on a capable device the forced kernel matches the reference for grouped and
/// multi-head shapes, head dimensions 128 and 64, and lengths that end mid-tile (the last tile's
/// K rows then reach past the cache's capacity into its slack).
pub(crate) fn coop_decode_choice(ctx: &Context) {
    let forced = AttentionOptions {
        decode: DecodeKernel::Cooperative,
        ..AttentionOptions::for_device(ctx.device())
    };
    let refused = |s, dtype, options: AttentionOptions| {
        let e = kpc_attention::Attention::new(ctx, &s, dtype, 64, options).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("cooperative-matrix decode")),
            "{e}"
        );
        e.to_string()
    };
    refused(shape(1, 8, 2, 128), KvDtype::F32, forced);
    refused(shape(1, 16, 1, 64), KvDtype::F16, forced);
    let spread = AttentionOptions {
        decode_spread: true,
        ..forced
    };
    refused(shape(1, 8, 2, 128), KvDtype::F16, spread);
    let auto = AttentionOptions::for_device(ctx.device());
    let a = kpc_attention::Attention::new(ctx, &shape(1, 8, 2, 128), KvDtype::F16, 64, auto);
    assert_ne!(a.unwrap().decode_kernel(), DecodeKernel::Cooperative);
    if !coop_capable(ctx) {
        let why = refused(shape(1, 8, 2, 128), KvDtype::F16, forced);
        assert!(
            why.contains("VK_KHR_cooperative_matrix") || why.contains("subgroups of 32"),
            "{why}"
        );
        return;
    }
    for (s, len) in [
        (shape(1, 8, 2, 128), 200),
        (shape(2, 16, 4, 64), 333),
        (shape(1, 4, 4, 128), 40),
        (shape(1, 32, 4, 128), 1000),
    ] {
        let (exact, stored) =
            decode_case(ctx, s, KvDtype::F16, forced, len, DecodeKernel::Cooperative);
        eprintln!(
            "cooperative decode {s:?} L={len}: error {exact:e} ({stored:e} on the stored K/V)"
        );
        assert!(exact <= 2e-3, "{s:?} L={len}: error {exact:e}");
    }
}
