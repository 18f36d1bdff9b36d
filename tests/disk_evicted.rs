//! "Would have hit" (issue 31 item 4) and the local miss journal (item 5), on real files: a key
//! evicted under a small KPC_CACHE_MAX_SIZE and requested again is explained as `evicted` with the
//! limit, by another process too; the record tolerates a torn line and stays bounded; what eviction
//! cost is counted with the limit that would have served it; the miss journal records builds with
//! their causes, and stays bounded too.

use crate::common;

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::disk::*;
use common::fake_backend::{FakeBackend, image};
use kpc::Config;
use kpc::admin::disk::{EVICTED_FILE, EVICTED_RECORDS};
use kpc::admin::disk::{MissCause, PersistentCache};
use kpc::admin::journal;
use kpc::admin::journal::RecordKind;
use kpc::admin::runtime::ProgramManager;
use kpc::{BuildOptions, SpecConstants};

const PAYLOAD: usize = 2000;

/// A cache that holds about three entries of [`PAYLOAD`] bytes.
fn small(root: &Path) -> PersistentCache {
    PersistentCache::new(settings(root).max_size(limit()))
}

fn limit() -> u64 {
    7 * 1024
}

/// Puts keys 0..6 (accessed in order), so eviction removes the oldest ones; returns the evicted keys.
fn fill(root: &Path) -> Vec<u64> {
    let c = small(root);
    for i in 0..6 {
        c.put(&key(i), &payload(i, PAYLOAD), Duration::from_millis(30));
    }
    c.wait_for_eviction();
    let evicted: Vec<u64> = (0..6)
        .filter(|&i| c.get_read_only(&key(i)).is_none())
        .collect();
    assert!(!evicted.is_empty(), "nothing was evicted");
    evicted
}

fn lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A record line as the record writes it (payload, tab, `#`, 8 hex of BLAKE3).
fn line(payload: &str) -> String {
    format!(
        "{payload}\t#{}\n",
        &blake3::hash(payload.as_bytes()).to_hex()[..8]
    )
}

#[test]
fn an_evicted_key_is_explained_as_evicted_with_the_limit_by_another_process() {
    if let Some(role) = child_role() {
        // The first process: fills the cache and exits.
        let root = std::path::PathBuf::from(role);
        let evicted = fill(&root);
        fs::write(root.join("evicted-keys"), format!("{evicted:?}")).unwrap();
        return;
    }
    let t = TempDir::new("evicted-explain");
    let root = t.join("cache");
    let st = child(
        "an_evicted_key_is_explained_as_evicted_with_the_limit_by_another_process",
        root.to_str().unwrap(),
    )
    .status()
    .unwrap();
    assert!(st.success());
    let evicted: Vec<u64> = fs::read_to_string(root.join("evicted-keys"))
        .unwrap()
        .trim_matches(['[', ']'])
        .split(", ")
        .map(|s| s.parse().unwrap())
        .collect();

    // A new process (this one) and a new instance, with no limit now.
    let c = cache(&root);
    let k = key(evicted[0]);
    let why = c.explain_miss(&k);
    assert_eq!(why.cause, MissCause::Evicted, "{why}");
    let ev = why.evicted.expect("the eviction");
    assert_eq!(ev.limit, limit());
    assert!(ev.bytes > PAYLOAD as u64);
    assert!(why.to_string().contains("KPC_CACHE_MAX_SIZE=7K"), "{why}");
    // A key never cached is still new; one that is cached is cached.
    assert_eq!(c.explain_miss(&key(99)).cause, MissCause::NewKey);
    assert_eq!(c.explain_miss(&key(5)).cause, MissCause::Cached);

    // A counted miss is counted as evicted and recorded; what it cost is in the record.
    assert!(c.get(&k).is_none());
    assert_eq!(c.stats().misses_evicted, 1);
    let cost = c.eviction_cost(SystemTime::UNIX_EPOCH).unwrap();
    assert_eq!(cost.evictions, evicted.len() as u64);
    assert_eq!(cost.misses, 1);
    assert_eq!(cost.miss_bytes, ev.bytes);
    let s = cost.suggested_max_size.expect("a suggestion");
    assert!(s >= limit() + ev.bytes, "{s}");
    // Nothing after a time to come.
    let later = c
        .eviction_cost(SystemTime::now() + Duration::from_secs(3600))
        .unwrap();
    assert_eq!((later.misses, later.evictions), (0, 0));
    // A read-only lookup writes nothing.
    let before = lines(&root.join(EVICTED_FILE)).len();
    assert!(c.get_read_only(&k).is_none());
    assert_eq!(lines(&root.join(EVICTED_FILE)).len(), before);
}

#[test]
fn a_torn_or_damaged_record_is_skipped() {
    let t = TempDir::new("evicted-torn");
    let root = t.join("cache");
    let evicted = fill(&root);
    let path = root.join(EVICTED_FILE);
    // Damage one record's bytes, and leave a torn one at the end (a writer killed mid-line).
    let text = fs::read_to_string(&path).unwrap();
    let text = text.replacen(" 7168", " 7169", 1) + "E 17957 ad23b603a2";
    fs::write(&path, text).unwrap();
    let c = small(&root);
    // Explained by the intact records (new-key for the damaged one), never misread.
    let causes: Vec<MissCause> = evicted
        .iter()
        .map(|&i| c.explain_miss(&key(i)).cause)
        .collect();
    assert!(
        causes
            .iter()
            .all(|c| matches!(c, MissCause::Evicted | MissCause::NewKey)),
        "{causes:?}"
    );
    assert!(causes.contains(&MissCause::NewKey), "{causes:?}");
    // The next pass appends after the torn line, on a line of its own.
    for i in 10..14 {
        c.put(&key(i), &payload(i, PAYLOAD), Duration::ZERO);
    }
    c.wait_for_eviction();
    let newly: Vec<u64> = (0..14)
        .filter(|i| !evicted.contains(i) && c.get_read_only(&key(*i)).is_none())
        .filter(|i| *i < 6 || *i >= 10)
        .collect();
    assert!(!newly.is_empty());
    for i in newly {
        assert_eq!(c.explain_miss(&key(i)).cause, MissCause::Evicted);
    }
}

#[test]
fn the_eviction_record_stays_bounded() {
    let t = TempDir::new("evicted-bound");
    let root = t.join("cache");
    fs::create_dir_all(&root).unwrap();
    // Far more records than the record keeps, as if written over months.
    let mut f = fs::File::create(root.join(EVICTED_FILE)).unwrap();
    for i in 0..3 * EVICTED_RECORDS {
        let l = line(&format!(
            "E {} aaaaaaaaaaaaaaaa/bbbbbbbbbbbbbbbb/cccccccccccccccc/{i:016x} 1234 8192",
            1_700_000_000_000u64 + i as u64
        ));
        f.write_all(l.as_bytes()).unwrap();
    }
    drop(f);
    let evicted = fill(&root);
    // Compacted to the last EVICTED_RECORDS when it grew past its bound, then the later passes'.
    let kept = lines(&root.join(EVICTED_FILE));
    assert!(kept.len() <= EVICTED_RECORDS + 16, "{}", kept.len());
    // The newest records are the ones kept.
    let c = small(&root);
    for i in evicted {
        assert_eq!(c.explain_miss(&key(i)).cause, MissCause::Evicted);
    }
}

#[test]
fn the_miss_journal_records_builds_and_hits_and_stays_bounded() {
    let t = TempDir::new("journal-local");
    let root = t.join("cache");
    fs::create_dir_all(&root).unwrap();
    let mut f = fs::File::create(root.join("misses.log")).unwrap();
    for i in 0..3 * 4096 {
        let l = line(&format!(
            r#"{{"t":1700000000000,"host":"old","kind":"build","key":"{i:064x}","label":"old.cl","layer":"disk","cause":"new-key","build_ms":1}}"#
        ));
        f.write_all(l.as_bytes()).unwrap();
    }
    drop(f);
    let config = Config::builder()
        .cache_dir(&root)
        .host_id("machine-a".to_string())
        .build()
        .unwrap();
    let be = Arc::new(FakeBackend::new().build_delay(Duration::from_millis(5)));
    let img = image("journal.cl", &["main"]);
    let get = || {
        let pm = ProgramManager::new(be.clone(), &config);
        pm.program(&img, &SpecConstants::new(), &BuildOptions::new("-O2"))
            .unwrap()
            .source
    };
    assert_eq!(get(), kpc::Source::Built);
    // Another process's view: a hit, recorded when its manager drops.
    assert_eq!(get(), kpc::Source::Disk);
    let c = cache(&root);
    let recs = journal::read_local(&c).unwrap();
    assert!(recs.len() <= 4096 + 2, "{}", recs.len());
    let mine: Vec<_> = recs.iter().filter(|r| r.host == "machine-a").collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    match &mine[0].kind {
        RecordKind::Build {
            label,
            layer,
            cause,
            build_ms,
            ..
        } => {
            assert_eq!(label, "journal.cl");
            assert_eq!(layer, "disk");
            assert_eq!(cause, "new-key");
            assert!(*build_ms >= 5);
        }
        k => panic!("{k:?}"),
    }
    match &mine[1].kind {
        RecordKind::Hits { count, saved_ms } => {
            assert_eq!(*count, 1);
            assert!(*saved_ms >= 5);
        }
        k => panic!("{k:?}"),
    }
}
