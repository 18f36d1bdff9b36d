//! Crash-safe loading with real child processes: a fake driver that aborts the process while loading
//! one chosen stored binary. The first process dies there; the next one finds the record the dead
//! process left, quarantines that binary (`crashed-loading`) and builds instead, and no process loads
//! it again. A process that dies outside a load costs no entry, and a live loader's record is never
//! taken for a crash.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use common::disk::{CHILD_ENV, TempDir, child, child_role};
use common::fake_backend::{FakeBackend, image};
use common::redis::RedisServer;
use kpc::Config;
use kpc::Source;
use kpc::StoreKey;
use kpc::admin::disk::PersistentCache;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::store::Provenance;
use kpc::admin::store::auth;
use kpc::seal;
use kpc::{BuildOptions, Digest, SpecConstants};
use kpc::{MacKey, RemoteUrl};

const ROOT: &str = "KPC_TEST_ROOT";

const REMOTE: &str = "KPC_TEST_REMOTE";
const SECRET: &str = "crash-test-fleet-secret-0123456789";

fn manager(root: &Path, crash_on: Option<&str>, remote: Option<&str>) -> ProgramManager {
    let be = FakeBackend::new();
    *be.abort_loading.lock() = crash_on.map(str::to_owned);
    let config = Config::builder()
        .cache_dir(root)
        .remote(remote.map(|u| RemoteUrl::parse(u).unwrap()))
        .remote_timeout(Duration::from_secs(5))
        .remote_key(remote.map(|_| MacKey::from_secret("KPC_CACHE_REMOTE_KEY", SECRET).unwrap()))
        .build()
        .unwrap();
    ProgramManager::new(Arc::new(be), &config)
}

fn acquire(pm: &ProgramManager, name: &str) -> Source {
    pm.kernel(
        &image(name, &["main"]),
        "main",
        &SpecConstants::new(),
        &BuildOptions::default(),
    )
    .unwrap()
    .source
}

/// The roles a child process runs (see each test).
#[test]
fn child_process() {
    let Some(role) = child_role() else { return };
    let root = PathBuf::from(std::env::var_os(ROOT).unwrap());
    // kpc's warnings on stderr, as the kpc command prints them.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .try_init();
    let crash = (role != "build" && role != "plain").then_some("boom.cl");
    let remote = std::env::var(REMOTE).ok();
    let pm = manager(&root, crash, remote.as_deref());
    let fine = acquire(&pm, "fine.cl");
    if role == "unrelated" {
        // Dies after its loads, for reasons of its own.
        std::process::abort();
    }
    let boom = acquire(&pm, "boom.cl");
    let d = pm.disk_stats().unwrap();
    println!(
        "RESULT fine={fine} boom={boom} crashed_loads={} crashed_refusals={} rejected={}",
        d.crashed_loads, d.crashed_refusals, d.rejected
    );
}

fn run(root: &Path, role: &str) -> Output {
    child("child_process", role)
        .env(ROOT, root)
        .env_remove(REMOTE)
        .output()
        .unwrap()
}

fn run_with_remote(root: &Path, role: &str, url: &str) -> Output {
    child("child_process", role)
        .env(ROOT, root)
        .env(REMOTE, url)
        .output()
        .unwrap()
}

fn result(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "child failed ({}):\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out.lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no result:\n{out}"))
        .to_owned()
}

fn files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).map_or_else(
        |_| Vec::new(),
        |rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        },
    )
}

#[test]
fn a_binary_that_crashes_its_loader_is_quarantined_and_never_loaded_again() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let t = TempDir::new("crash-load");
    let root = t.join("c");
    assert_eq!(
        result(&run(&root, "build")),
        "fine=built boom=built crashed_loads=0 crashed_refusals=0 rejected=0"
    );

    let crashed = run(&root, "crash");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(crashed.status.signal(), Some(libc::SIGABRT), "{crashed:?}");
    assert!(
        String::from_utf8_lossy(&crashed.stderr)
            .contains("fake driver: crashing while loading boom.cl"),
        "{crashed:?}"
    );
    assert_eq!(
        files(&root.join("loading")).len(),
        1,
        "the dead process's record"
    );

    // The driver still crashes on that binary: this process must not load it, and does not die.
    let after = run(&root, "after");
    assert_eq!(
        result(&after),
        "fine=disk boom=built crashed_loads=1 crashed_refusals=1 rejected=1"
    );
    let err = String::from_utf8_lossy(&after.stderr);
    println!("{err}");
    assert_eq!(
        err.matches("kpc::cache::disk: disk cache: a process died while loading a stored binary")
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("cause=\"crashed-loading\""), "{err}");
    let markers = files(&root.join("quarantine").join("crashed-loading"));
    assert_eq!(markers.len(), 1, "{markers:?}");
    assert!(
        files(&root.join("loading")).is_empty(),
        "the record became the marker"
    );
    // The rebuilt binary has the same bytes, so it was not stored again; a third process builds it
    // too and never loads it.
    assert_eq!(
        result(&run(&root, "again")),
        "fine=disk boom=built crashed_loads=0 crashed_refusals=0 rejected=0"
    );
}

#[test]
fn a_process_dying_outside_a_load_costs_no_entry() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let t = TempDir::new("crash-unrelated");
    let root = t.join("c");
    result(&run(&root, "build"));
    let died = run(&root, "unrelated");
    assert!(!died.status.success());
    assert_eq!(
        result(&run(&root, "plain")),
        "fine=disk boom=disk crashed_loads=0 crashed_refusals=0 rejected=0"
    );
    assert!(files(&root.join("quarantine").join("crashed-loading")).is_empty());
    assert!(files(&root.join("loading")).is_empty());
}

#[test]
fn a_live_loaders_record_is_not_a_crash_and_a_dead_ones_is() {
    let t = TempDir::new("crash-record");
    let cache = PersistentCache::new(kpc::admin::disk::DiskCacheSettings::from_config_at(
        &Config::default(),
        t.path(),
    ));
    let key = StoreKey::new(
        "backend=fake\n",
        Digest([1; 32]),
        Digest([2; 32]),
        9,
        b"",
        "",
    );
    let rec = cache.begin_load(&key, b"binary").unwrap().unwrap();
    assert_eq!(files(&t.join("loading")).len(), 1);
    // Held by a live loader (this process): not taken for a crash, and a second load goes ahead.
    assert!(cache.crashed_before(&key, b"binary").is_none());
    let second = cache.begin_load(&key, b"binary").unwrap().unwrap();
    drop((rec, second));
    assert!(files(&t.join("loading")).is_empty());

    // What a process killed inside the driver leaves: the record, unlocked.
    let hash = &blake3::hash(b"binary").to_hex()[..32];
    let name = format!("{}.4194305.0", key.digest().to_hex());
    std::fs::write(t.join("loading").join(&name), hash).unwrap();
    assert!(
        cache.crashed_before(&key, b"other bytes").is_none(),
        "other bytes of the key load"
    );
    let c = cache.begin_load(&key, b"binary").unwrap_err();
    assert!(
        c.to_string()
            .starts_with("crashed-loading: this binary crashed a process"),
        "{c}"
    );
    assert!(c.marker.is_file());
    assert!(
        files(&t.join("loading")).is_empty(),
        "the record became the marker"
    );
    let s = cache.stats();
    assert_eq!((s.crashed_loads, s.crashed_refusals), (1, 1));
    // Another key is unaffected.
    let other = StoreKey::new(
        "backend=fake\n",
        Digest([1; 32]),
        Digest([3; 32]),
        9,
        b"",
        "",
    );
    assert!(cache.begin_load(&other, b"binary").unwrap().is_some());
}

/// Two machines (two cache directories) sharing a real redis-server: the first crashes loading a
/// binary it published, finds out in its next process and publishes a crashed-loading marker; when a
/// third machine has published the same bytes again, a machine whose driver would crash on them too
/// never loads them from the remote.
#[test]
fn a_crash_on_one_machine_keeps_every_machine_from_loading_that_binary() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let Some(redis) =
        RedisServer::start("a_crash_on_one_machine_keeps_every_machine_from_loading_that_binary")
    else {
        return;
    };
    let url = redis.url();
    let t = TempDir::new("crash-fleet");
    let (a, b) = (t.join("machine-a"), t.join("machine-b"));
    assert_eq!(
        result(&run_with_remote(&a, "build", &url)),
        "fine=built boom=built crashed_loads=0 crashed_refusals=0 rejected=0"
    );
    let crashed = run_with_remote(&a, "crash", &url);
    assert!(!crashed.status.success(), "{crashed:?}");
    assert_eq!(
        result(&run_with_remote(&a, "after", &url)),
        "fine=disk boom=built crashed_loads=1 crashed_refusals=1 rejected=1"
    );
    let markers = redis.keys("kpc-crashed/*");
    assert_eq!(markers.len(), 1, "{markers:?}");
    // Machine C, whose driver is fine with it, builds boom (A removed the remote copy it refused) and
    // publishes the same bytes again.
    assert_eq!(
        result(&run_with_remote(&t.join("machine-c"), "build", &url)),
        "fine=remote boom=built crashed_loads=0 crashed_refusals=0 rejected=0"
    );
    // Machine B: fine comes from the remote; boom's remote binary is marked, so it is built (had it
    // been loaded, this process would have aborted).
    let b_run = run_with_remote(&b, "after", &url);
    assert_eq!(
        result(&b_run),
        "fine=remote boom=built crashed_loads=0 crashed_refusals=0 rejected=0"
    );
    let err = String::from_utf8_lossy(&b_run.stderr);
    assert!(err.contains("crashed-loading marker kpc-crashed/"), "{err}");

    // A marker is authenticated like an entry: one made without the fleet's key is not honored.
    let name = &markers[0];
    let pm = manager(&t.join("keys"), None, None);
    let key = pm.disk_key(
        &image("boom.cl", &["main"]),
        &SpecConstants::new(),
        &BuildOptions::default(),
    );
    let fleet = MacKey::from_secret("KPC_CACHE_REMOTE_KEY", SECRET).unwrap();
    let genuine = auth::open(&Some(fleet).into(), &key, &redis.get(name)).unwrap();
    assert_eq!(genuine.bytes(), name.as_bytes(), "the marker names itself");
    let other =
        MacKey::from_secret("KPC_CACHE_REMOTE_KEY", "not the fleet's secret at all").unwrap();
    redis.set(
        name,
        &auth::wrap(
            &Some(other).into(),
            &key,
            &seal(&key, name.as_bytes(), Duration::ZERO),
            &Provenance::for_key("forger", &key, None, Duration::ZERO),
        ),
    );
    assert_eq!(
        result(&run_with_remote(&t.join("machine-d"), "plain", &url)),
        "fine=remote boom=remote crashed_loads=0 crashed_refusals=0 rejected=0"
    );
}
