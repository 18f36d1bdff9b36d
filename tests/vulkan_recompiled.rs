//! "Build time saved" counts only compiles a disk hit avoided: the Vulkan backend reads the driver's
//! pipeline-creation feedback, and a hit whose pipelines the driver compiled anyway (lavapipe's
//! pipeline cache is a stub, so every one there) is counted apart, in the disk, store-level and
//! backend counters.

use crate::common;

use std::time::Duration;

use kpc::Source;
use kpc::kernels::spirv_image;
use kpc::{Config, Context};

use common::disk::TempDir;
use common::drivers::{assert_no_validation_errors, vulkan_device};

#[test]
fn disk_hits_the_driver_recompiled_save_no_build_time() {
    let test = "disk_hits_the_driver_recompiled_save_no_build_time";
    let Some(d) = vulkan_device(test) else {
        return;
    };
    let root = TempDir::new("recompiled");
    let config = Config::builder()
        .persistent(true)
        .cache_dir(root.path())
        .build()
        .unwrap();
    let image = spirv_image("saxpy").unwrap();
    let entry = image.spirv_reflection().unwrap().entry_points[0]
        .name
        .clone();
    let get = |ctx: &Context| ctx.kernel(&image, &entry).unwrap();
    // The first context builds and stores; the second (its own memory cache) loads from disk.
    let first = Context::builder()
        .device(&d)
        .config(config.clone())
        .build()
        .unwrap();
    assert_eq!(get(&first).source(), Source::Built);
    drop(first);
    let ctx = Context::builder()
        .device(&d)
        .config(config.clone())
        .build()
        .unwrap();
    let k = get(&ctx);
    assert_eq!(k.source(), Source::Disk);
    let disk = ctx.stats().disk.expect("the disk cache is on");
    let backend = ctx.stats().backend_counters;
    // The local disk is counted once, in `disk`, not again as a level of `stores`.
    assert!(ctx.stats().stores.is_empty());
    assert_eq!((disk.hits, backend.programs_loaded), (1, 1));
    let lavapipe = d.name.contains("llvmpipe");
    match k.driver_cache_hit() {
        Some(false) => {
            assert_eq!(disk.recompiled_hits, 1, "{disk:?}");
            assert_eq!(disk.build_time_saved, Duration::ZERO, "{disk:?}");
            assert!(disk.build_time_recompiled > Duration::ZERO, "{disk:?}");
            assert_eq!(backend.programs_loaded_recompiled, 1, "{backend:?}");
        }
        hit => {
            assert!(
                !lavapipe,
                "lavapipe reports every pipeline as compiled, not {hit:?}"
            );
            assert_eq!(disk.recompiled_hits, 0, "{disk:?}");
            assert!(disk.build_time_saved > Duration::ZERO, "{disk:?}");
            assert_eq!(backend.programs_loaded_recompiled, 0, "{backend:?}");
        }
    }
    assert_no_validation_errors(test);
}
