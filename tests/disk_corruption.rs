//! Every way an entry or the cache directory can be damaged or unusable is a miss: never a panic, never
//! damaged bytes, never a failed build. Corrupt entries are removed and counted; each cause is warned
//! about once per cache instance.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::disk::*;
use kpc::PutOutcome;
use kpc::admin::store::WarnCause;

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Publishes key `i`, damages it with `damage`, and checks: the lookup misses, the damage is counted
/// once and the entry removed, and a new put takes slot 0 again and is served.
fn damaged_entry_is_a_counted_miss(i: u64, what: &str, damage: impl Fn(&Path)) {
    let t = TempDir::new("corrupt");
    let c = cache(t.path());
    let k = key(i);
    let data = payload(i, 3000);
    assert_eq!(c.put(&k, &data, Duration::ZERO), PutOutcome::Published(0));
    let leaf = c.entry_dir(&k);
    damage(&leaf);
    let (r, ev) = capture(|| c.get(&k));
    assert!(r.is_none(), "{what}: damaged entry must miss");
    assert_eq!(c.stats().corruptions, 1, "{what}");
    assert_eq!(disk_warnings(&ev), ["corrupt"], "{what}");
    assert!(
        !leaf.join("0.src").exists() && !leaf.join("0.bin").exists(),
        "{what}: removed"
    );
    assert_eq!(
        c.put(&k, &data, Duration::ZERO),
        PutOutcome::Published(0),
        "{what}"
    );
    assert_eq!(c.get(&k).unwrap().bytes(), &data[..], "{what}");
    assert_eq!(c.stats().corruptions, 1, "{what}: counted once");
    assert!(c.verify(false).unwrap().bad.is_empty(), "{what}");
}

#[test]
fn bit_flip_in_bin_payload() {
    damaged_entry_is_a_counted_miss(1, "payload flip", |l| flip_byte(&l.join("0.bin"), -1));
    damaged_entry_is_a_counted_miss(2, "payload flip mid", |l| flip_byte(&l.join("0.bin"), 1500));
}

#[test]
fn bit_flips_in_bin_header_fields() {
    for (off, what) in [
        (0, "magic"),
        (9, "version"),
        (12, "kind"),
        (17, "length"),
        (30, "key digest"),
        (60, "checksum"),
    ] {
        damaged_entry_is_a_counted_miss(3, what, |l| flip_byte(&l.join("0.bin"), off));
    }
}

#[test]
fn truncated_extended_and_empty_bin() {
    let set_len = |n: u64| {
        move |l: &Path| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(l.join("0.bin"))
                .unwrap();
            f.set_len(n).unwrap();
        }
    };
    damaged_entry_is_a_counted_miss(4, "truncated to half", set_len(1500));
    damaged_entry_is_a_counted_miss(5, "shorter than the header", set_len(10));
    damaged_entry_is_a_counted_miss(6, "empty", set_len(0));
    damaged_entry_is_a_counted_miss(7, "header only", set_len(88));
    damaged_entry_is_a_counted_miss(8, "trailing bytes", |l| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(l.join("0.bin"))
            .unwrap();
        f.write_all(b"junk").unwrap();
    });
}

#[test]
fn damaged_src() {
    damaged_entry_is_a_counted_miss(9, "src payload flip", |l| flip_byte(&l.join("0.src"), -5));
    damaged_entry_is_a_counted_miss(10, "src magic", |l| flip_byte(&l.join("0.src"), 1));
    damaged_entry_is_a_counted_miss(11, "src truncated", |l| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(l.join("0.src"))
            .unwrap();
        f.set_len(100).unwrap();
    });
    damaged_entry_is_a_counted_miss(12, "src empty", |l| {
        std::fs::write(l.join("0.src"), b"").unwrap()
    });
}

#[test]
fn missing_bin_is_an_incomplete_entry() {
    damaged_entry_is_a_counted_miss(13, "missing .bin", |l| {
        std::fs::remove_file(l.join("0.bin")).unwrap()
    });
}

#[test]
fn bin_of_another_key_is_caught_by_the_key_binding() {
    damaged_entry_is_a_counted_miss(14, "foreign .bin", |l| {
        // A valid .bin of a different key, checksum and all, swapped in next to our .src.
        let t = TempDir::new("foreign");
        let other = cache(t.path());
        other.put(&key(99), &payload(14, 3000), Duration::ZERO);
        std::fs::copy(other.entry_dir(&key(99)).join("0.bin"), l.join("0.bin")).unwrap();
    });
}

#[test]
fn missing_src_leaves_an_invisible_orphan_that_the_next_put_replaces() {
    let t = TempDir::new("corrupt");
    let c = cache(t.path());
    let k = key(15);
    c.put(&k, b"first", Duration::ZERO);
    let leaf = c.entry_dir(&k);
    std::fs::remove_file(leaf.join("0.src")).unwrap();
    assert!(c.get(&k).is_none());
    assert_eq!(
        c.stats().corruptions,
        0,
        "an orphan .bin is not readable as an entry at all"
    );
    let r = c.verify(false).unwrap();
    assert_eq!((r.checked, r.bad.len(), r.stale.len()), (0, 0, 1));
    assert_eq!(
        c.put(&k, b"second", Duration::ZERO),
        PutOutcome::Published(0)
    );
    assert_eq!(c.get(&k).unwrap().bytes(), b"second");
}

#[test]
fn bin_replaced_by_a_directory_is_a_read_error_not_a_crash() {
    let t = TempDir::new("corrupt");
    let c = cache(t.path());
    let k = key(16);
    c.put(&k, b"data", Duration::ZERO);
    let leaf = c.entry_dir(&k);
    std::fs::remove_file(leaf.join("0.bin")).unwrap();
    std::fs::create_dir(leaf.join("0.bin")).unwrap();
    let (r, ev) = capture(|| c.get(&k));
    assert!(r.is_none());
    assert!(c.stats().read_errors + c.stats().corruptions >= 1);
    assert_eq!(disk_warnings(&ev).len(), 1);
    // The slot is unusable, so the put takes the next one, which is then served.
    let out = c.put(&k, b"data", Duration::ZERO);
    assert!(matches!(out, PutOutcome::Published(_)), "{out:?}");
    assert_eq!(c.get(&k).unwrap().bytes(), b"data");
}

#[test]
fn each_cause_is_warned_once_per_instance() {
    let t = TempDir::new("corrupt");
    let c = cache(t.path());
    for i in 0..20 {
        c.put(&key(i), &payload(i, 500), Duration::ZERO);
        flip_byte(&c.entry_dir(&key(i)).join("0.bin"), -1);
    }
    let (_, ev) = capture(|| {
        for i in 0..20 {
            assert!(c.get(&key(i)).is_none());
        }
    });
    assert_eq!(c.stats().corruptions, 20);
    assert_eq!(
        disk_warnings(&ev),
        ["corrupt"],
        "one warning for twenty corrupt entries"
    );
    assert_eq!(c.warnings(), [WarnCause::Corrupt]);
    // A new instance (another process, or a new context) warns again, once.
    let c2 = cache(t.path());
    c2.put(&key(0), b"x", Duration::ZERO);
    flip_byte(&c2.entry_dir(&key(0)).join("0.bin"), -1);
    let (_, ev) = capture(|| c2.get(&key(0)));
    assert_eq!(disk_warnings(&ev), ["corrupt"]);
}

#[test]
fn chmod_000_on_a_bin() {
    let t = TempDir::new("perm");
    let bypass = permission_bits_bypassed(t.path());
    let c = cache(&t.join("c"));
    let k = key(17);
    c.put(&k, b"secret", Duration::ZERO);
    let bin = c.entry_dir(&k).join("0.bin");
    set_mode(&bin, 0o000);
    let (r, ev) = capture(|| c.get(&k));
    if bypass {
        // Root (or CAP_DAC_OVERRIDE) reads a mode-000 file: the entry is simply valid.
        eprintln!(
            "note: permission bits are bypassed for this user; chmod 000 does not block reads"
        );
        assert_eq!(r.unwrap().bytes(), b"secret");
        assert!(disk_warnings(&ev).is_empty());
        return;
    }
    assert!(r.is_none(), "an unreadable .bin is a miss");
    assert_eq!(disk_warnings(&ev), ["permission-denied"]);
    assert_eq!(c.stats().read_errors, 1);
    assert_eq!(
        c.stats().corruptions,
        0,
        "unreadable is not corrupt: left in place"
    );
    assert!(bin.exists());
    // The put goes to the next slot, and lookups find it there from now on.
    assert_eq!(
        c.put(&k, b"secret", Duration::ZERO),
        PutOutcome::Published(1)
    );
    let (r, ev) = capture(|| {
        (0..5)
            .map(|_| c.get(&k).map(|h| h.slot()))
            .collect::<Vec<_>>()
    });
    assert_eq!(r, vec![Some(1); 5]);
    assert!(
        disk_warnings(&ev).is_empty(),
        "already warned for this cause"
    );
}

#[test]
fn unreadable_leaf_directory() {
    let t = TempDir::new("perm");
    let bypass = permission_bits_bypassed(t.path());
    let c = cache(&t.join("c"));
    let k = key(18);
    c.put(&k, b"v", Duration::ZERO);
    let leaf = c.entry_dir(&k);
    set_mode(&leaf, 0o000);
    let (r, ev) = capture(|| {
        (
            c.get(&k).map(|h| h.into_bytes()),
            c.put(&key(18), b"v", Duration::ZERO),
        )
    });
    set_mode(&leaf, 0o755);
    if bypass {
        eprintln!(
            "note: permission bits are bypassed for this user; a mode-000 directory stays usable"
        );
        assert_eq!(r.0.unwrap(), b"v");
        return;
    }
    assert!(r.0.is_none());
    assert_eq!(r.1, PutOutcome::Failed);
    assert_eq!(
        disk_warnings(&ev),
        ["permission-denied"],
        "read and put failures: one warning"
    );
}

/// A read-only cache root still serves its hits; puts fail quietly (one warning) and builds go on.
/// Made read-only with mode 0555 where permission bits apply, else with the immutable attribute (which
/// binds root too); where neither is possible the test says so and checks what does apply.
#[test]
fn read_only_root() {
    let t = TempDir::new("ro");
    let root = t.join("c");
    let c = cache(&root);
    c.put(&key(1), b"kept", Duration::ZERO);
    let how = if !permission_bits_bypassed(t.path()) {
        for d in files_under(&root)
            .iter()
            .filter_map(|f| f.parent())
            .chain([root.as_path(), &root.join("v1")])
        {
            set_mode(d, 0o555);
        }
        // Every directory on the way to the entry (files_under gives leaves; add the levels between).
        let mut d = c.entry_dir(&key(1));
        while d != root {
            set_mode(&d, 0o555);
            d.pop();
        }
        "mode 0555"
    } else if make_immutable(&root) {
        "immutable attribute"
    } else {
        eprintln!(
            "note: running privileged and chattr is unavailable: the root cannot be made read-only"
        );
        let c2 = cache(&root);
        assert_eq!(c2.get(&key(1)).unwrap().bytes(), b"kept");
        assert_eq!(
            c2.put(&key(2), b"n", Duration::ZERO),
            PutOutcome::Published(0)
        );
        return;
    };
    eprintln!("root made read-only with the {how}");
    let c2 = cache(&root);
    let (r, ev) = capture(|| {
        let hit = c2.get(&key(1)).map(|h| h.into_bytes());
        let miss = match c2.get_or_lock(&key(2)) {
            Lookup::Miss(g) => {
                assert!(
                    !g.holds_lock(),
                    "no lock can be created in a read-only leaf"
                );
                g.put(b"new", Duration::ZERO)
            }
            Lookup::Hit(_) => panic!("key 2 was never stored"),
        };
        let puts: Vec<_> = (3..10)
            .map(|i| c2.put(&key(i), b"n", Duration::ZERO))
            .collect();
        (hit, miss, puts)
    });
    undo_immutable(&root);
    assert_eq!(
        r.0.unwrap(),
        b"kept",
        "hits still work on a read-only cache"
    );
    assert_eq!(r.1, PutOutcome::Failed);
    assert!(r.2.iter().all(|o| *o == PutOutcome::Failed));
    let w = disk_warnings(&ev);
    assert_eq!(
        w,
        ["permission-denied"],
        "one warning for every failed lock and put"
    );
    assert_eq!(c2.stats().failed_puts, 8);
}

#[test]
fn missing_root_is_created_on_first_put() {
    let t = TempDir::new("missing");
    let root = t.join("a/b/c/kpc");
    let c = cache(&root);
    assert!(c.get(&key(1)).is_none());
    assert!(!root.exists());
    assert_eq!(
        c.put(&key(1), b"x", Duration::ZERO),
        PutOutcome::Published(0)
    );
    assert!(root.join("v1").is_dir());
    // Removed from under a running cache: misses again, then recreated.
    std::fs::remove_dir_all(&root).unwrap();
    let (r, ev) = capture(|| (c.get(&key(1)), c.put(&key(1), b"y", Duration::ZERO)));
    assert!(r.0.is_none());
    assert_eq!(r.1, PutOutcome::Published(0));
    assert!(
        disk_warnings(&ev).is_empty(),
        "a missing directory is just an empty cache"
    );
}

/// A root that can never exist (its parent is a regular file, or under /proc): every request misses,
/// every put fails, one warning; works the same as root.
#[test]
fn uncreatable_root() {
    let t = TempDir::new("uncreatable");
    std::fs::write(t.join("file"), b"not a directory").unwrap();
    for root in [t.join("file/cache"), "/proc/kpc-no-such-dir/cache".into()] {
        let c = cache(&root);
        let (r, ev) = capture(|| {
            let mut outs = Vec::new();
            for i in 0..5 {
                match c.get_or_lock(&key(i)) {
                    Lookup::Miss(g) => outs.push(g.put(b"x", Duration::ZERO)),
                    Lookup::Hit(_) => panic!("nothing can be stored"),
                }
            }
            outs
        });
        assert!(
            r.iter().all(|o| *o == PutOutcome::Failed),
            "{root:?}: {r:?}"
        );
        assert_eq!(disk_warnings(&ev).len(), 1, "{root:?}: {ev:?}");
        assert_eq!(c.stats().misses, 5);
    }
}

// ---------------------------------------------------------------------------------------------------
// A full disk, simulated with RLIMIT_FSIZE in a child process (the limit binds root too).

const FSIZE_LIMIT: u64 = 64 << 10;

#[test]
fn child() {
    let Some(role) = child_role() else { return };
    let root = std::path::PathBuf::from(std::env::var("KPC_TEST_ROOT").unwrap());
    match role.as_str() {
        "fsize" => {
            // SAFETY: plain libc calls on this process only: ignore SIGXFSZ (so an over-limit write fails
            // with EFBIG instead of killing the process) and lower the file size limit.
            unsafe {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let lim = libc::rlimit {
                    rlim_cur: FSIZE_LIMIT,
                    rlim_max: FSIZE_LIMIT,
                };
                assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
            }
            let c = cache(&root);
            let (outs, ev) = capture(|| {
                let mut outs = Vec::new();
                for i in 0..5 {
                    outs.push(c.put(&key(i), &payload(i, 1 << 20), Duration::ZERO));
                }
                outs.push(c.put(&key(100), &payload(100, 1000), Duration::ZERO));
                outs
            });
            assert!(
                outs[..5].iter().all(|o| *o == PutOutcome::Failed),
                "{outs:?}"
            );
            assert_eq!(outs[5], PutOutcome::Published(0), "small entries still fit");
            assert_eq!(disk_warnings(&ev), ["no-space"]);
            assert_eq!(c.stats().failed_puts, 5);
            for i in 0..5 {
                assert!(c.get(&key(i)).is_none());
            }
            println!("CHILD-OK");
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn full_disk_via_rlimit_fsize_fails_puts_quietly() {
    let t = TempDir::new("fsize");
    let out = common::disk::child("child", "fsize")
        .env("KPC_TEST_ROOT", t.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("CHILD-OK"), "{text}");
    // What the child left: one valid entry, no partial files, no temporaries.
    let c = cache(t.path());
    let r = c.verify(false).unwrap();
    assert_eq!(
        (r.checked, r.valid, r.bad.len(), r.stale.len()),
        (1, 1, 0, 0),
        "{r:?}"
    );
    assert!(files_named(t.path(), ".tmp").is_empty());
    assert_eq!(c.get(&key(100)).unwrap().bytes(), &payload(100, 1000)[..]);
}

/// Run as root, the permission tests above can only check the privileged behaviour. This re-runs them as
/// an unprivileged user (uid/gid 65534 via setpriv), so the denied-access paths are exercised too.
#[test]
fn permission_tests_also_pass_unprivileged() {
    if child_role().is_some() {
        return;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return; // already unprivileged: the tests above took the denied-access paths themselves
    }
    let Ok(out) = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--nocapture",
            "--test-threads=1",
            "chmod_000_on_a_bin",
            "unreadable_leaf_directory",
            "read_only_root",
        ])
        .env_remove(CHILD_ENV)
        .output()
    else {
        eprintln!(
            "note: setpriv is not installed: the denied-access paths ran only where not root"
        );
        return;
    };
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if text.contains("Permission denied") && !text.contains("running ") {
        eprintln!("note: the test binary is not executable by uid 65534 here: {text}");
        return;
    }
    assert!(out.status.success(), "{text}");
    assert!(text.contains("3 passed"), "{text}");
    assert!(
        !text.contains("bypassed"),
        "the unprivileged run must take the denied-access paths: {text}"
    );
}
