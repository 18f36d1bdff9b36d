//! Support for the disk cache tests: temporary directories, keys and payloads, child processes (the
//! test binary re-executed), a `tracing` capture, and helpers for permission scenarios that behave
//! differently as root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kpc::Digest;
use kpc::StoreKey;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};

/// The environment variable that turns a test binary run into a child role. Read only by tests.
pub const CHILD_ENV: &str = "KPC_DISK_TEST_CHILD";

/// A directory under the system temp dir, removed (after restoring permissions) on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "kpc-{tag}-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = Command::new("chattr")
            .args(["-R", "-i"])
            .arg(&self.0)
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status();
        let _ = Command::new("chmod")
            .args(["-R", "u+rwx"])
            .arg(&self.0)
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub const DEVICE: &str = "backend=fake\nkpc_format=1\ndevice_name=Fake Device 9000\ndriver=1.2.3\n";

/// Key number `i` with an image of `image_len` bytes; every key differs in its image digest.
pub fn key_n(i: u64, image_len: u64) -> StoreKey {
    StoreKey::new(
        DEVICE,
        Digest::of(DEVICE.as_bytes()),
        Digest::of(format!("image-{i}").as_bytes()),
        image_len,
        &[1, 0, 0, 0, 2, 7, 0, 0, 0, 0, 0, 0, 0],
        "-O2 -DKPC=1",
    )
    .with_label(&format!("image{i}.spv"))
}

pub fn key(i: u64) -> StoreKey {
    key_n(i, 4096)
}

/// Deterministic bytes for (seed, len), so any process can check what another one wrote.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Settings for tests: the defaults, eviction inline so its effects are visible when `put` returns.
pub fn settings(root: &Path) -> DiskCacheSettings {
    DiskCacheSettings::new(root).background_eviction(false)
}

pub fn cache(root: &Path) -> PersistentCache {
    PersistentCache::new(settings(root))
}

/// Every regular file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

pub fn files_named(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    files_under(dir)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect()
}

/// Sum of the sizes of every entry file (`.src`/`.bin`) under the versioned tree.
pub fn entry_bytes(root: &Path) -> u64 {
    files_under(&root.join("v1"))
        .iter()
        .filter(|p| {
            let s = p.to_string_lossy();
            s.ends_with(".src") || s.ends_with(".bin")
        })
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// The full path (`module::name`) of the test named `name` in this binary, from its own `--list`:
/// the integration tests are one binary, so a child re-run needs the module to stay `--exact`. The
/// module is the calling file's (several files name a test `child_process`); a full path is taken as
/// it is.
#[track_caller]
pub fn test_path(name: &str) -> String {
    static LIST: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let caller = std::panic::Location::caller().file();
    let module = Path::new(caller).file_stem().unwrap().to_string_lossy();
    let list = LIST.get_or_init(|| {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--list", "--format=terse"])
            .env_remove(CHILD_ENV)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(str::to_string)
            .collect()
    });
    let want = format!("{module}::{name}");
    let found: Vec<&String> = list
        .iter()
        .filter(|p| **p == want || p.ends_with(&format!("::{want}")))
        .collect();
    if found.is_empty() && list.iter().any(|p| p == name) {
        return name.to_string();
    }
    assert_eq!(
        found.len(),
        1,
        "test {want:?} matches {found:?} in this binary"
    );
    found[0].clone()
}

/// The test binary itself, re-executed to run only the test `test` (its name, with or without its
/// module path) in role `role`.
#[track_caller]
pub fn child(test: &str, role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        &test_path(test),
        "--nocapture",
        "--test-threads=1",
        "--quiet",
    ])
    .env(CHILD_ENV, role);
    c
}

/// The role this process was started in, if it is a child.
pub fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// Waits for `path` to exist (a child's "ready" signal), failing the test if the child died first.
pub fn wait_for_file(path: &Path, child: &mut Child) {
    let start = Instant::now();
    while !path.exists() {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("child exited ({st}) before creating {}", path.display());
        }
        // A generous bound so a wedged child fails the test instead of hanging CI.
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "child never created {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Flips one bit of the byte at `offset` (negative: from the end).
pub fn flip_byte(path: &Path, offset: i64) {
    let mut b = std::fs::read(path).unwrap();
    let i = if offset < 0 {
        (b.len() as i64 + offset) as usize
    } else {
        offset as usize
    };
    b[i] ^= 0x20;
    std::fs::write(path, b).unwrap();
}

/// Whether this process can ignore permission bits (root, or CAP_DAC_OVERRIDE): then chmod 000 does
/// not stop it reading, and a 0555 directory does not stop it writing.
pub fn permission_bits_bypassed(scratch: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let d = scratch.join("perm-probe");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o555)).unwrap();
    let bypassed = std::fs::write(d.join("x"), b"x").is_ok();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _ = std::fs::remove_dir_all(&d);
    bypassed
}

/// Makes every directory under (and including) `dir` refuse new entries, even to root, with the
/// immutable attribute. Returns false where chattr is unavailable or not permitted.
pub fn make_immutable(dir: &Path) -> bool {
    Command::new("chattr")
        .args(["-R", "+i"])
        .arg(dir)
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
        && std::fs::write(dir.join("probe"), b"x").is_err()
}

pub fn undo_immutable(dir: &Path) {
    let _ = Command::new("chattr").args(["-R", "-i"]).arg(dir).status();
}

// ---------------------------------------------------------------------------------------------------
// tracing capture

/// One captured event: level, target and its fields as strings (`message` included).
#[derive(Debug, Clone)]
pub struct Ev {
    pub level: tracing::Level,
    pub target: String,
    pub fields: BTreeMap<String, String>,
}

struct Visitor<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Visitor<'_> {
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.0.insert(f.name().to_string(), v.to_string());
    }
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_string(), format!("{v:?}"));
    }
}

struct CaptureLayer(Arc<Mutex<Vec<Ev>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CaptureLayer {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = BTreeMap::new();
        event.record(&mut Visitor(&mut fields));
        self.0.lock().unwrap().push(Ev {
            level: *event.metadata().level(),
            target: event.metadata().target().to_string(),
            fields,
        });
    }
}

/// Runs `f` with a subscriber that records every event emitted on this thread.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Vec<Ev>) {
    use tracing_subscriber::layer::SubscriberExt;
    let events = Arc::new(Mutex::new(Vec::new()));
    let sub = tracing_subscriber::registry().with(CaptureLayer(events.clone()));
    let r = tracing::subscriber::with_default(sub, f);
    let ev = events.lock().unwrap().clone();
    (r, ev)
}

/// The `cause` fields of the disk cache's warnings among `events`.
pub fn disk_warnings(events: &[Ev]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.level == tracing::Level::WARN && e.target == "kpc::cache::disk")
        .map(|e| e.fields.get("cause").cloned().unwrap_or_default())
        .collect()
}

/// What a lookup on the product's path found: the store chain's `get`, then on a miss the key's
/// build lock, through the [`Store`](kpc::Store) trait as the chain calls it.
pub enum Lookup {
    /// A verified binary (found at once, or published by another builder while this caller waited).
    Hit(kpc::StoreHit),
    /// Nothing usable: build, then [`Build::put`]. (Boxed: the key is large, as in the library.)
    Miss(Box<Build>),
}

/// The right to build one key, as the chain holds it: the store's answer to `lock_for_build`.
pub struct Build {
    cache: PersistentCache,
    key: StoreKey,
    lock: kpc::admin::store::BuildLock,
}

impl Build {
    /// Whether the key's build lock is held (false after a timeout or on an unwritable cache).
    pub fn holds_lock(&self) -> bool {
        matches!(self.lock, kpc::admin::store::BuildLock::Held(_))
    }

    /// Whether the disk keeps this key at all (false outside the image size limits: it offers no lock).
    pub fn persists(&self) -> bool {
        !matches!(self.lock, kpc::admin::store::BuildLock::NotOffered)
    }

    /// Publishes `bytes` as the chain does after a build, then releases the lock.
    pub fn put(self, bytes: &[u8], build_time: Duration) -> kpc::PutOutcome {
        let outcome = kpc::Store::put(&self.cache, &self.key, bytes, build_time);
        drop(self.lock);
        outcome
    }
}

/// The disk cache on the product's path, for tests that look up and build as the store chain does.
pub trait ProductPath {
    /// `Store::get`, then on a miss `Store::lock_for_build` (which waits for another builder and
    /// reads again).
    fn get_or_lock(&self, key: &StoreKey) -> Lookup;
}

impl ProductPath for PersistentCache {
    fn get_or_lock(&self, key: &StoreKey) -> Lookup {
        use kpc::admin::store::BuildLock;
        if let Some(hit) = kpc::Store::get(self, key, kpc::Access::ReadWrite) {
            return Lookup::Hit(hit);
        }
        match kpc::Store::lock_for_build(self, key) {
            BuildLock::Published(hit) => Lookup::Hit(hit),
            lock => Lookup::Miss(Box::new(Build {
                cache: self.clone(),
                key: key.clone(),
                lock,
            })),
        }
    }
}
