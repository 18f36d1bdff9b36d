// README "Embedding kpc", blobs: keep kpc's binaries in your own storage (oneDNN-style) and
// recreate a kernel from one without a build, on either backend (`KPC_DEVICE`).
use std::collections::HashMap;

use kpc::{Config, Context, KernelRequest};

fn main() -> kpc::Result<()> {
    let mut config = Config::from_env()?; // KPC_DEVICE and the rest
    config.persistent = false; // no disk cache: your storage is the only one
    let ctx = Context::builder().config(config.clone()).build()?;
    let image = kpc::kernels::shipped("saxpy", ctx.backend())?;
    // The key: image, entry, and any .spec(..) and .options(..); the blob id leaves out the entry.
    let request = KernelRequest::new(&image, "saxpy");
    let kernel = ctx.kernel_with(&request)?; // built
    let mut storage = HashMap::new(); // yours: a database, a file, a bundle in your package
    storage.insert(ctx.cache_blob_id(&request)?, kernel.cache_blob()?);

    // Later, in another context (another process): look the id up, recreate without building.
    let later = Context::builder().config(config).build()?;
    let blob = &storage[&later.cache_blob_id(&request)?];
    let again = later.kernel_from_blob(&request, blob)?;
    println!(
        "{} from {} (first: {})",
        again.name(),
        again.source(),
        kernel.source()
    );
    assert_eq!(again.source(), kpc::Source::Blob);
    Ok(())
}
