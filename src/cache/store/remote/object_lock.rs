//! One build per key per fleet on object stores (`s3://`, `fs://`): a fleet lock made of a lease
//! object, `kpc-lock/v<format>/<device digest>/<key digest>`, created with a create-once write.
//!
//! - **Taking it.** S3: a `PUT` with `If-None-Match: *` (OpenDAL's `if_not_exists`), which S3 and the
//!   services that copy it (MinIO, R2, GCS's XML API) perform atomically; the holder then reads the
//!   lease back and holds only if it is its own, so a server that checks the condition and writes in
//!   two steps (s3s-fs) lets at most the last writer hold. `fs`: the lease written to a file of its own
//!   and hard-linked into place, which fails if the name exists (OpenDAL's `if_not_exists` there checks
//!   first and writes after, which two processes can both pass); atomic on local file systems and NFS.
//! - **The lease.** The object holds the holder's token and an expiry [`LEASE`] ahead; the holder
//!   renews it every third of that from a thread of its own, and deletes it when the build is done
//!   (published or failed). A lease past its expiry is a dead holder's: a contender deletes it (if it
//!   still holds what was read) and creates its own, so a killed builder blocks the fleet for one
//!   lease at most. Two contenders breaking the same dead lease at once can both build: a second build,
//!   never a wrong entry (what is published is verified like any entry).
//! - **Where not offered.** A service without create-once writes (OpenDAL reports no
//!   `write_with_if_not_exists`) gets no fleet lock: each machine builds a cold key itself, as before.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};

use super::ops::{Failure, Ops};
use crate::cache::store::WarnCause;
use crate::config::RemoteUrl;

/// How long a lease holds without renewal.
pub(crate) const LEASE: Duration = Duration::from_secs(10);

/// The lease record: `kpc-lease <token> <expiry in ms since the epoch>`.
fn record(token: &str) -> Vec<u8> {
    let until = SystemTime::now() + LEASE;
    let ms = until
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("kpc-lease {token} {ms}\n").into_bytes()
}

/// A lease's token and whether it has expired; `None` if it is not a lease record.
fn parse(v: &[u8]) -> Option<(String, bool)> {
    let s = std::str::from_utf8(v).ok()?;
    let mut it = s.split_whitespace();
    if it.next()? != "kpc-lease" {
        return None;
    }
    let token = it.next()?.to_owned();
    let ms: u128 = it.next()?.parse().ok()?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    Some((token, ms < now))
}

/// Where the lease objects are written.
enum Place {
    /// Through OpenDAL, with `if_not_exists` (s3).
    Object,
    /// As files under this root, with `O_EXCL` (fs).
    Files(PathBuf),
}

/// The fleet locks of one object-store remote.
pub(crate) struct ObjectLocks {
    ops: Arc<Ops>,
    place: Arc<Place>,
}

impl ObjectLocks {
    /// The locks of `url` through `ops`, or `None` where the service cannot create once (or is
    /// Redis, which has its own).
    pub fn new(url: &RemoteUrl, ops: Arc<Ops>) -> Option<ObjectLocks> {
        let place = match url {
            RemoteUrl::Fs { root } => Place::Files(root.clone()),
            RemoteUrl::S3 { .. } if ops.creates_once() => Place::Object,
            _ => return None,
        };
        Some(ObjectLocks {
            ops,
            place: Arc::new(place),
        })
    }

    /// Tries once to take lock `name` for `token`: `Ok(false)` while another live holder has it.
    pub fn try_acquire(&self, name: &str, token: &str) -> Result<bool, Failure> {
        if self.create(name, token)? {
            return Ok(true);
        }
        let Some(current) = self.read(name)? else {
            // Released between our create and our read: try once more.
            return self.create(name, token);
        };
        match parse(&current) {
            Some((_, true)) => {
                // A dead holder's lease: remove it if it is still that one, then take our own.
                if self.read(name)?.as_deref() == Some(&current[..]) {
                    self.remove(name)?;
                }
                self.create(name, token)
            }
            _ => Ok(false),
        }
    }

    /// Creates lock `name` if it does not exist, then checks it is ours.
    fn create(&self, name: &str, token: &str) -> Result<bool, Failure> {
        let value = record(token);
        let created = match &*self.place {
            Place::Object => self.ops.write_if_absent(name, value)?,
            Place::Files(root) => create_file(&root.join(name), &value)?,
        };
        if !created {
            return Ok(false);
        }
        // Ours only if what is there now is our lease (a server that checks and writes in two
        // steps may have let another writer in after us).
        let back = self.read(name)?;
        Ok(back
            .and_then(|v| parse(&v))
            .is_some_and(|(t, _)| t == token))
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, Failure> {
        match &*self.place {
            Place::Object => self.ops.read(name),
            Place::Files(root) => match std::fs::read(root.join(name)) {
                Ok(v) => Ok(Some(v)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io_failure(&e)),
            },
        }
    }

    fn remove(&self, name: &str) -> Result<(), Failure> {
        match &*self.place {
            Place::Object => self.ops.delete(name),
            Place::Files(root) => match std::fs::remove_file(root.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_failure(&e)),
                _ => Ok(()),
            },
        }
    }

    /// Holds lock `name` (taken with `token`) until the guard drops: renews the lease from a thread
    /// of its own, then removes it if it is still ours.
    pub fn hold(&self, name: String, token: String) -> HeldObjectLock {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let me = ObjectLocks {
            ops: Arc::clone(&self.ops),
            place: Arc::clone(&self.place),
        };
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("kpc-fleet-lease".into())
            .spawn(move || me.renew_until_stopped(&name, &token, &s));
        HeldObjectLock {
            stop,
            thread: thread.ok(),
        }
    }

    fn ours(&self, name: &str, token: &str) -> bool {
        let v = self.read(name).ok().flatten();
        v.and_then(|v| parse(&v)).is_some_and(|(t, _)| t == token)
    }

    fn renew_until_stopped(&self, name: &str, token: &str, stop: &(Mutex<bool>, Condvar)) {
        let (flag, cv) = stop;
        loop {
            {
                let mut stopped = flag.lock();
                if !*stopped {
                    cv.wait_for(&mut stopped, LEASE / 3);
                }
                if *stopped {
                    break;
                }
            }
            // A renewal that fails is retried at the next tick; a lease lost meanwhile (taken over
            // after expiring) is not renewed over its new holder.
            if self.ours(name, token) {
                let _ = match &*self.place {
                    Place::Object => self.ops.write(name, record(token)),
                    Place::Files(root) => replace_file(&root.join(name), &record(token)),
                };
            }
        }
        if self.ours(name, token) {
            let _ = self.remove(name);
        }
    }
}

/// A held object-store fleet lock; dropping it stops the renewals and removes the lease.
pub(crate) struct HeldObjectLock {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for HeldObjectLock {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn io_failure(e: &std::io::Error) -> Failure {
    Failure {
        cause: WarnCause::of(e),
        detail: e.to_string(),
        skipped: false,
    }
}

/// Creates `path` with `value` if nothing is there; `Ok(false)` if something is. The value is written
/// to a file of this process first and hard-linked into place, which fails if `path` exists: the
/// lease appears whole or not at all (`O_EXCL` semantics, on NFS too).
fn create_file(path: &std::path::Path, value: &[u8]) -> Result<bool, Failure> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io_failure(&e))?;
    }
    let tmp = path.with_extension(format!(
        "new-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let written = std::fs::File::create(&tmp).and_then(|mut f| f.write_all(value));
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_failure(&e)),
    }
}

/// Replaces `path` with `value` at once (a temporary file renamed over it).
fn replace_file(path: &std::path::Path, value: &[u8]) -> Result<(), Failure> {
    let tmp = path.with_extension(format!("renew-{}", std::process::id()));
    std::fs::write(&tmp, value)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_failure(&e)
        })
}
