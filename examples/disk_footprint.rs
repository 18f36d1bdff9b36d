//! What the disk cache costs the file system per entry: files, directories and allocated blocks
//! (`du`) after publishing N entries, against the bytes of the binaries themselves. Shared file
//! systems (NFS, Lustre) and container layers pay for every inode, so this is a figure to watch.
//!
//! Each entry has an image of its own (as every shader of an engine does), so each has its own
//! image, spec and options directories. The cache lives under `std::env::temp_dir()` (set TMPDIR to
//! measure another file system) and is removed afterwards.
//!
//! Run: `cargo run --release --example disk_footprint -- [ENTRIES] [PAYLOAD_BYTES]`
//! (defaults 1000 and 5600: the engine averaged 5.6 KB per entry).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use kpc::Digest;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::{PutOutcome, StoreKey};

#[derive(Default)]
struct Census {
    files: u64,
    empty_files: u64,
    dirs: u64,
    bytes: u64,
}

fn census(dir: &Path, c: &mut Census) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            c.dirs += 1;
            census(&e.path(), c);
        } else {
            c.files += 1;
            c.bytes += m.len();
            if m.len() == 0 {
                c.empty_files += 1;
            }
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map_or(1000, |a| a.parse().expect("ENTRIES: a number"));
    let len: usize = args
        .next()
        .map_or(5600, |a| a.parse().expect("PAYLOAD_BYTES: a number"));
    let root = std::env::temp_dir().join(format!("kpc-footprint-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let cache = PersistentCache::new(
        DiskCacheSettings::new(&root)
            .max_size(0)
            .sync(false)
            .background_eviction(false),
    );
    let device = "backend=vulkan\nkpc_format=1\ndeviceName=footprint\n";
    let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    for i in 0..n {
        let key = StoreKey::new(
            device,
            Digest::of(device.as_bytes()),
            Digest::of(&i.to_le_bytes()),
            len as u64,
            b"",
            "",
        )
        .with_label(&format!("shader{i}.comp"));
        let out = cache.put(&key, &data, Duration::from_millis(5));
        assert!(matches!(out, PutOutcome::Published(_)), "{out:?}");
    }
    let mut c = Census::default();
    census(&root, &mut c);
    let du = Command::new("du")
        .arg("-sk")
        .arg(&root)
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        });
    let per = |x: u64| x as f64 * 1000.0 / n as f64;
    println!(
        "kpc disk footprint: {n} entries of {len} payload bytes under {}",
        root.display()
    );
    println!(
        "files        {:>10}  ({:.0} per 1000 entries; {} empty)",
        c.files,
        per(c.files),
        c.empty_files
    );
    println!(
        "directories  {:>10}  ({:.0} per 1000 entries)",
        c.dirs,
        per(c.dirs)
    );
    println!(
        "file bytes   {:>10}  ({:.2} MiB per 1000 entries; payload {:.2} MiB)",
        c.bytes,
        per(c.bytes) / 1048576.0,
        per(len as u64 * n) / 1048576.0
    );
    match du {
        Some(k) => println!(
            "du -sk      {k:>10} KiB ({:.2} MiB per 1000 entries)",
            per(k) / 1024.0
        ),
        None => println!("du -sk: unavailable"),
    }
    let _ = std::fs::remove_dir_all(&root);
}
