//! Read-only layers (`KPC_CACHE_READONLY_DIRS`): searched after the local cache, their hits copied to
//! it, and never modified. "Never modified" is checked on the real directory tree: every file's and
//! directory's path, bytes, mtime and ctime before and after (a recorded access time, a created lock
//! file or a removed entry would each change one), after hits, misses with builds, corrupt entries and
//! binaries the backend refuses, in this process and in child processes configured by the
//! environment. Plus the variable's parsing errors.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::disk::{TempDir, capture, child_role, disk_warnings, files_named, flip_byte};
use common::fake_backend::{FakeBackend, image};
use filetime::FileTime;
use kpc::Source;
use kpc::admin::config::vars;
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, SpecConstants, StoreKind};
use kpc::{Config, ConfigError};

/// Path -> (bytes for a file, mtime and ctime in ns) for everything under `dir`, `dir` included.
type Tree = BTreeMap<PathBuf, (Option<Vec<u8>>, i128, i128)>;

fn snapshot(dir: &Path) -> Tree {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            let bytes = m.is_file().then(|| read_noatime(e.path()));
            let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
            (
                e.path().to_owned(),
                (
                    bytes,
                    ns(m.mtime(), m.mtime_nsec()),
                    ns(m.ctime(), m.ctime_nsec()),
                ),
            )
        })
        .collect()
}

/// The file's bytes, read without refreshing its access time (which would hide a lookup's).
fn read_noatime(p: &Path) -> Vec<u8> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(p)
        .unwrap();
    let mut v = Vec::new();
    f.read_to_end(&mut v).unwrap();
    v
}

/// Sets every file's access time an hour back, so that a lookup allowed to record access would do so
/// (and change the file's ctime); then snapshots the tree.
fn age_and_snapshot(dir: &Path) -> Tree {
    let hour_ago = FileTime::from_unix_time(FileTime::now().unix_seconds() - 3600, 0);
    for f in common::disk::files_under(dir) {
        filetime::set_file_atime(&f, hour_ago).unwrap();
    }
    let tree = snapshot(dir);
    // File times come from the kernel's coarse clock (one tick, up to 10 ms): a change within the tick
    // of the snapshot would carry the same times. Wait until a new file's change time is past every
    // time in the snapshot; from then on, any change shows.
    let newest = tree.values().map(|(_, m, c)| *m.max(c)).max().unwrap_or(0);
    let probe = dir.parent().unwrap().join(".clock-probe");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        std::fs::write(&probe, b"").unwrap();
        let m = std::fs::metadata(&probe).unwrap();
        if m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128 > newest {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the file clock never moved"
        );
        std::thread::yield_now();
    }
    std::fs::remove_file(&probe).unwrap();
    tree
}

fn config(local: &Path, readonly: &[&Path]) -> Config {
    Config::builder()
        .cache_dir(local)
        .readonly_dirs(readonly.iter().copied())
        .build()
        .unwrap()
}

fn spec() -> SpecConstants {
    SpecConstants::new()
}

fn opts() -> BuildOptions {
    BuildOptions::new("-O1")
}

fn loads(be: &FakeBackend) -> usize {
    be.binary_loads.load(Ordering::SeqCst)
}

/// A cache directory holding a built entry for each of `names`, written as a normal local cache.
fn baked_layer(root: &Path, names: &[&str]) {
    let be = Arc::new(FakeBackend::new());
    let pm = ProgramManager::new(be, &Config::builder().cache_dir(root).build().unwrap());
    for n in names {
        pm.program(&image(n, &["main"]), &spec(), &opts()).unwrap();
    }
}

/// In a child: acquires `ro.cl` with the configuration from the environment and prints where it
/// came from.
#[test]
fn child() {
    let Some(role) = child_role() else { return };
    assert_eq!(role, "acquire");
    let be = Arc::new(FakeBackend::new());
    let pm = ProgramManager::new(be.clone(), &Config::from_env().unwrap());
    let p = pm
        .program(&image("ro.cl", &["main"]), &spec(), &opts())
        .unwrap();
    println!("KPCSTORE source={} builds={}", p.source, be.builds());
}

fn child_source(local: &Path, readonly: &Path) -> String {
    let out = common::disk::child("child", "acquire")
        .env(vars::CACHE_DIR, local)
        .env(vars::CACHE_READONLY_DIRS, readonly)
        .env_remove(vars::CACHE_PERSISTENT)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("KPCSTORE "))
        .unwrap_or_else(|| panic!("no result line in {text}"))
        .to_string()
}

#[test]
fn a_read_only_layer_serves_hits_that_are_copied_up_and_is_never_modified() {
    let t = TempDir::new("ro");
    let (ro, local) = (t.join("baked"), t.join("local"));
    baked_layer(&ro, &["ro.cl"]);
    let before = age_and_snapshot(&ro);
    assert!(before.len() > 5, "{before:?}");

    let be = Arc::new(FakeBackend::new());
    let pm = ProgramManager::new(be.clone(), &config(&local, &[&ro]));
    let p = pm
        .program(&image("ro.cl", &["main"]), &spec(), &opts())
        .unwrap();
    assert_eq!(p.source, Source::ReadOnly);
    assert_eq!((be.builds(), loads(&be)), (0, 1));
    let st = pm.store_stats();
    assert_eq!(
        (st[0].kind, st[1].kind),
        (StoreKind::Disk, StoreKind::ReadOnly)
    );
    assert_eq!((st[0].misses, st[0].backfills, st[1].hits), (1, 1, 1));
    assert_eq!(snapshot(&ro), before, "a hit changed the read-only layer");

    // A miss everywhere: built, stored locally, and the layer still untouched.
    let p = pm
        .program(&image("new.cl", &["main"]), &spec(), &opts())
        .unwrap();
    assert_eq!(p.source, Source::Built);
    assert_eq!(pm.store_stats()[1].misses, 1);
    assert_eq!(pm.disk_cache().unwrap().entries().unwrap().len(), 2);
    assert_eq!(
        snapshot(&ro),
        before,
        "a miss and a build changed the read-only layer"
    );

    // The next manager finds both locally.
    let pm = ProgramManager::new(be.clone(), &config(&local, &[&ro]));
    for n in ["ro.cl", "new.cl"] {
        let p = pm.program(&image(n, &["main"]), &spec(), &opts()).unwrap();
        assert_eq!(p.source, Source::Disk, "{n}");
    }
    assert_eq!(pm.store_stats()[1].hits + pm.store_stats()[1].misses, 0);

    // The same across processes configured by the environment: a first process copies the entry up
    // from the layer, the next one hits its local cache.
    let local2 = t.join("local2");
    assert_eq!(child_source(&local2, &ro), "source=readonly builds=0");
    assert_eq!(child_source(&local2, &ro), "source=disk builds=0");
    assert_eq!(
        snapshot(&ro),
        before,
        "a child process changed the read-only layer"
    );

    // The check can fail: the same tree opened as a writable local cache records the hit's access.
    // (Aged again: the reads above let the kernel refresh the access times, which changes no ctime.)
    let before = age_and_snapshot(&ro);
    let be = Arc::new(FakeBackend::new());
    let pm = ProgramManager::new(be, &config(&ro, &[]));
    let p = pm
        .program(&image("ro.cl", &["main"]), &spec(), &opts())
        .unwrap();
    assert_eq!(p.source, Source::Disk);
    assert_ne!(snapshot(&ro), before, "a writable lookup records access");
}

#[test]
fn a_corrupt_entry_in_a_read_only_layer_is_a_miss_never_loaded_and_left_in_place() {
    for ext in [".bin", ".src"] {
        let t = TempDir::new("ro-corrupt");
        let (ro, local) = (t.join("baked"), t.join("local"));
        baked_layer(&ro, &["c.cl"]);
        let files = files_named(&ro, ext);
        assert_eq!(files.len(), 1);
        flip_byte(&files[0], -3);
        let before = age_and_snapshot(&ro);

        let be = Arc::new(FakeBackend::new());
        let pm = ProgramManager::new(be.clone(), &config(&local, &[&ro]));
        let (p, ev) = capture(|| {
            pm.program(&image("c.cl", &["main"]), &spec(), &opts())
                .unwrap()
        });
        assert_eq!(p.source, Source::Built, "{ext}");
        assert_eq!((be.builds(), loads(&be)), (1, 0), "{ext}: never loaded");
        assert_eq!(disk_warnings(&ev), ["corrupt"], "{ext}");
        assert!(
            ev.iter().any(|e| e
                .fields
                .get("message")
                .is_some_and(|m| m.contains("left in place"))),
            "{ev:?}"
        );
        assert_eq!(
            snapshot(&ro),
            before,
            "{ext}: the corrupt layer was modified"
        );
        // The fresh build went to the local cache.
        let pm = ProgramManager::new(be.clone(), &config(&local, &[&ro]));
        let p = pm
            .program(&image("c.cl", &["main"]), &spec(), &opts())
            .unwrap();
        assert_eq!(p.source, Source::Disk, "{ext}");
        assert_eq!(snapshot(&ro), before, "{ext}");
    }
}

#[test]
fn a_binary_refused_from_a_read_only_layer_is_left_there_and_rebuilt_locally() {
    let t = TempDir::new("ro-refused");
    let (ro, local) = (t.join("baked"), t.join("local"));
    baked_layer(&ro, &["x.cl"]);
    let before = age_and_snapshot(&ro);

    let be = Arc::new(FakeBackend::new());
    be.reject_binaries.store(true, Ordering::SeqCst);
    let pm = ProgramManager::new(be.clone(), &config(&local, &[&ro]));
    let (p, ev) = capture(|| {
        pm.program(&image("x.cl", &["main"]), &spec(), &opts())
            .unwrap()
    });
    assert_eq!(p.source, Source::Built);
    // Asked once: the layer would return the same bytes again, so it is skipped for the request.
    assert_eq!((be.builds(), loads(&be)), (1, 1));
    assert_eq!(pm.store_stats()[1].rejected, 1);
    let causes: Vec<_> = ev
        .iter()
        .filter(|e| e.target == "kpc::cache::store")
        .filter_map(|e| e.fields.get("cause").cloned())
        .collect();
    assert_eq!(causes, ["rejected"]);
    assert_eq!(snapshot(&ro), before);
    be.reject_binaries.store(false, Ordering::SeqCst);
    let pm = ProgramManager::new(be.clone(), &config(&local, &[&ro]));
    let p = pm
        .program(&image("x.cl", &["main"]), &spec(), &opts())
        .unwrap();
    assert_eq!(p.source, Source::Disk);
}

#[test]
fn layers_are_searched_in_order_and_switched_off_with_the_disk_cache() {
    let t = TempDir::new("ro-order");
    let (a, b, local) = (t.join("a"), t.join("b"), t.join("local"));
    baked_layer(&a, &["only-a.cl", "both.cl"]);
    baked_layer(&b, &["only-b.cl", "both.cl"]);
    let be = Arc::new(FakeBackend::new());
    let pm = ProgramManager::new(be.clone(), &config(&local, &[&a, &b]));
    for n in ["both.cl", "only-a.cl", "only-b.cl"] {
        let p = pm.program(&image(n, &["main"]), &spec(), &opts()).unwrap();
        assert_eq!(p.source, Source::ReadOnly, "{n}");
    }
    let st = pm.store_stats();
    assert_eq!((st[1].hits, st[1].misses), (2, 1), "{st:?}");
    assert_eq!((st[2].hits, st[2].misses), (1, 0), "{st:?}");
    assert_eq!(be.builds(), 0);

    let off = Config::builder()
        .cache_dir(&local)
        .readonly_dirs([&a, &b])
        .persistent(false)
        .build()
        .unwrap();
    let pm = ProgramManager::new(be.clone(), &off);
    assert!(pm.stores().is_empty());
    let p = pm
        .program(&image("both.cl", &["main"]), &spec(), &opts())
        .unwrap();
    assert_eq!(p.source, Source::Built);
}

fn env(pairs: &[(&'static str, OsString)]) -> impl Fn(&str) -> Option<OsString> + use<> {
    let pairs = pairs.to_vec();
    move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
}

fn readonly_dirs(v: impl Into<OsString>) -> Result<Config, ConfigError> {
    Config::from_lookup(env(&[(vars::CACHE_READONLY_DIRS, v.into())]))
}

#[test]
fn readonly_dirs_parse_like_path_and_bad_elements_are_named() {
    assert!(readonly_dirs("/a").is_ok());
    assert_eq!(
        readonly_dirs("/a:/b/c").unwrap().readonly_dirs,
        [PathBuf::from("/a"), PathBuf::from("/b/c")]
    );
    assert!(
        Config::from_lookup(env(&[]))
            .unwrap()
            .readonly_dirs
            .is_empty()
    );
    // Paths are bytes: non-UTF-8 is accepted.
    {
        use std::os::unix::ffi::OsStringExt;
        let c = readonly_dirs(OsString::from_vec(b"/x/\xff:/y".to_vec())).unwrap();
        assert_eq!(c.readonly_dirs.len(), 2);
    }
    for (value, index, element, problem) in [
        ("", 1, "", "is empty"),
        ("/a::/b", 2, "", "is empty"),
        ("/a:", 2, "", "is empty"),
        (":/a", 1, "", "is empty"),
        ("/a:rel/b", 2, "rel/b", "is a relative path"),
        ("./here", 1, "./here", "is a relative path"),
    ] {
        let e = readonly_dirs(value).unwrap_err();
        match &e {
            ConfigError::InvalidListElement {
                var,
                value: v,
                index: i,
                element: el,
                problem: p,
                ..
            } => {
                assert_eq!(
                    (*var, v.as_str(), *i, el.as_str(), *p),
                    (vars::CACHE_READONLY_DIRS, value, index, element, problem)
                );
            }
            other => panic!("{value:?}: {other:?}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("KPC_CACHE_READONLY_DIRS") && msg.contains("absolute"),
            "{msg}"
        );
    }
    // The builder checks the same.
    let e = Config::builder()
        .readonly_dirs(["/ok", "relative"])
        .build()
        .unwrap_err();
    assert!(
        matches!(e, ConfigError::InvalidListElement { index: 2, .. }),
        "{e:?}"
    );
}

#[test]
fn kpc_status_shows_the_layers() {
    let t = TempDir::new("ro-status");
    let (a, b) = (t.join("a"), t.join("missing"));
    baked_layer(&a, &["s.cl"]);
    let joined = format!("{}:{}", a.display(), b.display());
    let out = common::cli::kpc_command()
        .env_clear()
        .env(vars::CACHE_DIR, t.join("local"))
        .env(vars::CACHE_READONLY_DIRS, &joined)
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("KPC_CACHE_READONLY_DIRS             = {joined}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("read-only layer 1: {} (searched)", a.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "read-only layer 2: {} (searched, missing: every lookup misses)",
            b.display()
        )),
        "{text}"
    );
    let out = common::cli::kpc_command()
        .env_clear()
        .env(vars::CACHE_READONLY_DIRS, "rel")
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("KPC_CACHE_READONLY_DIRS=\"rel\""), "{err}");
}
