//! Bytes on the wire with and without compressed transfers (`KPC_CACHE_REMOTE_COMPRESS`), on a real
//! redis-server and a real S3 server (s3s-fs), each behind a loopback TCP proxy of this program's that
//! counts every byte both ways.
//!
//! The entries are real driver binaries: every verified entry of the disk caches named on the command
//! line (fill one with, e.g., `KPC_DEVICE=opencl:0 KPC_CACHE_DIR=/tmp/kpc-pocl kpc attention`). For each
//! server and each level (0 = uncompressed, then the levels given), a builder publishes them all
//! through a fresh `RemoteStore` (bytes client to server counted), then a fresh reader (a new store, a
//! new connection, as a cold process has) fetches and verifies them all (bytes server to client
//! counted, and the time the fetches took: the median of five such readers).
//!
//! Run: `cargo run --release --example remote_wire -- CACHE_DIR... [--levels 3,19] [--backend B]`
//! (`--backend vulkan|opencl`: only that backend's entries). The servers are
//! the test suite's (tests/common: `/usr/bin/redis-server`, `s3s-fs` from scripts/test.sh); the
//! program re-runs itself with the S3 test credentials in its environment, where OpenDAL reads them.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kpc::RemoteUrl;
use kpc::admin::disk::{DiskCacheSettings, PersistentCache};
use kpc::admin::store::{EntryAuth, RemoteStore};
use kpc::{Access, PutOutcome, Store, StoreKey};

#[path = "../tests/common/mod.rs"]
mod common;

/// Bytes a proxy moved: client to server, server to client.
#[derive(Default)]
struct Counted {
    up: AtomicU64,
    down: AtomicU64,
}

impl Counted {
    fn take(&self) -> (u64, u64) {
        (
            self.up.swap(0, Ordering::SeqCst),
            self.down.swap(0, Ordering::SeqCst),
        )
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, n: Arc<Counted>, up: bool) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let k = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => k,
        };
        // Counted before they are passed on: once the other end has them, the count has them too.
        let c = if up { &n.up } else { &n.down };
        c.fetch_add(k as u64, Ordering::SeqCst);
        if to.write_all(&buf[..k]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A loopback proxy to `upstream`, counting into the returned counters; returns its port.
fn proxy(upstream: u16) -> (u16, Arc<Counted>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(Counted::default());
    let n2 = Arc::clone(&n);
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let Ok(s) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
            let (a, b) = (Arc::clone(&n2), Arc::clone(&n2));
            std::thread::spawn(move || pump(c, s, a, true));
            std::thread::spawn(move || pump(s2, c2, b, false));
        }
    });
    (port, n)
}

/// Every verified entry of the disk caches at `dirs` (of `backend` only, if given): key and binary.
fn entries(dirs: &[PathBuf], backend: Option<&str>) -> Vec<(StoreKey, Vec<u8>, Duration)> {
    let mut out = Vec::new();
    for d in dirs {
        let cache = PersistentCache::new(DiskCacheSettings::new(d));
        for e in cache.entries().expect("list the cache") {
            let Some(key) = e.record.as_ref().and_then(|r| r.to_key()) else {
                continue;
            };
            if backend.is_some_and(|b| e.record.as_ref().is_some_and(|r| r.backend() != b)) {
                continue;
            }
            if let Some(hit) = cache.get_read_only(&key) {
                out.push((key, hit.bytes().to_vec(), hit.build_time()));
            }
        }
    }
    out
}

fn store(url: &str, level: u8) -> RemoteStore {
    let auth = EntryAuth::default()
        .compression(i32::from(level))
        .host("wire-bench".into());
    let t = Duration::from_secs(30);
    RemoteStore::open(&RemoteUrl::parse(url).unwrap(), t, auth, t).expect("open the remote")
}

/// Publishes then fetches every entry at `url` (through the proxy counting `n`), at `level`.
fn measure(server: &str, url: &str, n: &Counted, level: u8, set: &[(StoreKey, Vec<u8>, Duration)]) {
    let raw: u64 = set.iter().map(|(_, b, _)| b.len() as u64).sum();
    n.take();
    {
        let w = store(url, level);
        for (k, b, t) in set {
            assert!(
                matches!(w.put(k, b, *t), PutOutcome::Published(_)),
                "publish"
            );
        }
    } // Dropping the store drains its publisher.
    let (put_up, put_down) = n.take();
    // Five cold readers; the bytes of one, the median time.
    let mut times = Vec::new();
    let (mut get_up, mut get_down) = (0, 0);
    for _ in 0..5 {
        let r = store(url, level);
        let start = Instant::now();
        for (k, b, _) in set {
            let hit = r.get(k, Access::ReadWrite).expect("a verified hit");
            assert_eq!(hit.bytes(), &b[..]);
        }
        times.push(start.elapsed());
        (get_up, get_down) = n.take();
    }
    times.sort();
    let fetch = times[2];
    println!(
        "| {server} | {level} | {} | {raw} | {put_up} | {get_down} | {:.0}% | {:.1} | {} |",
        set.len(),
        100.0 * get_down as f64 / raw as f64,
        fetch.as_secs_f64() * 1e3,
        put_down + get_up,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut levels = vec![3u8, 19];
    let mut dirs = Vec::new();
    let mut backend = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--levels" {
            let v = it.next().expect("--levels L1,L2");
            levels = v.split(',').map(|l| l.parse().expect("a level")).collect();
        } else if a == "--backend" {
            backend = Some(it.next().expect("--backend vulkan|opencl").clone());
        } else {
            dirs.push(PathBuf::from(a));
        }
    }
    assert!(
        !dirs.is_empty(),
        "usage: remote_wire CACHE_DIR... [--levels 3,19] [--backend vulkan|opencl]"
    );
    if std::env::var_os("KPC_WIRE_CHILD").is_none() {
        // OpenDAL's S3 service reads its credentials from the environment.
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.args(&args).env("KPC_WIRE_CHILD", "1");
        common::s3::S3Server::credentials(&mut c);
        std::process::exit(c.status().unwrap().code().unwrap_or(1));
    }
    let set = entries(&dirs, backend.as_deref());
    assert!(!set.is_empty(), "no verified entry in {dirs:?}");
    println!(
        "| server | level | entries | binary bytes | bytes up (publish) | bytes down (fetch) | down/binary | fetch ms (cold store, loopback, median of 5) | other direction bytes |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let redis = common::redis::RedisServer::spawn(&[]);
    let s3 = common::s3::S3Server::start("remote_wire").expect("s3s-fs installed");
    let (rp, rn) = proxy(redis.port());
    let (sp, sn) = proxy(s3.port());
    for level in std::iter::once(0).chain(levels.iter().copied()) {
        // A fresh namespace per level: the S3 prefix, the redis database.
        let db = 1 + level as u32 % 15;
        measure(
            "redis",
            &format!("redis://127.0.0.1:{rp}/{db}"),
            &rn,
            level,
            &set,
        );
        let url = format!(
            "s3://{}/l{level}?region=us-east-1&endpoint=http://127.0.0.1:{sp}",
            common::s3::BUCKET
        );
        measure("s3", &url, &sn, level, &set);
    }
}
