//! The remote tier (`KPC_CACHE_REMOTE`): a [`Store`](crate::cache::store::Store) on a shared service through OpenDAL (redis, fs,
//! s3), looked up after every local layer.
//!
//! - **What it holds.** Each entry is the sealed entry ([`seal`](crate::runtime::seal)) in an authentication envelope
//!   ([`wrap`](crate::cache::store::auth::wrap)), with a keyed MAC when `KPC_CACHE_REMOTE_KEY` is set. A read goes through
//!   [`open`](crate::cache::store::auth::open): a missing or wrong MAC, damage, truncation or an entry for another key is refused,
//!   counted, warned once per cause and never loaded.
//! - **Where.** `kpc/v<format>/<device digest>/<key digest>`: kpc's format version and the device
//!   fingerprint are in every name, so a driver update or a new kpc never reads an older entry.
//! - **Hits** are copied to the local disk by the chain (its backfill), so the next process hits
//!   locally.
//! - **Puts** come after the local disk's, through `publish`: the build waits at most
//!   `KPC_CACHE_REMOTE_TIMEOUT` for them, and not at all while the breaker is open.
//! - **One build per key per fleet**: after every store missed, the process takes the key's fleet
//!   lock; others wait, bounded by `KPC_CACHE_LOCK_TIMEOUT`, polling the remote for the entry, then
//!   build themselves. Redis: `SET NX` with a renewed TTL (`fleet_lock`); s3 and fs: a lease object
//!   created once (a conditional write, or a hard link) and renewed (`object_lock`).
//! - **Retention** (`imp/retention.rs`): a last-served record beside each entry, and collection by
//!   age and quota (`kpc cache gc --remote`); a `KPC_CACHE_REMOTE_NOT_BEFORE` cut-off.
//! - **Compression**: entries travel zstd-compressed (`KPC_CACHE_REMOTE_COMPRESS`, envelope version 3).
//! - **Failures** (down, killed, slow, full, garbage) are misses or skipped puts, one warning per
//!   cause. After a connection failure or a timeout a circuit breaker (`breaker`) skips every remote
//!   call (lookup, fleet lock, publish) for a hold-off that grows from 2 s to 60 s while the remote
//!   stays unhealthy; one answered probe closes it. A frozen remote costs a process one timeout.
//!
//! - **Miss journal** (Redis only): the fleet's miss journal records go to the capped stream
//!   `kpc-journal/v1` (`crate::cache::journal`), behind the breaker; `kpc cache report --remote`
//!   reads it.
//! - **Crashed loads**: a binary found to crash a process that loaded it (`disk/loading.rs`) gets a
//!   marker under `kpc-crashed/v<format>/<device digest>/<key digest>.<binary hash>`, authenticated
//!   like an entry, and no machine loads that binary from the remote again.
//!
//! The URL type is the configuration's (`crate::config::RemoteUrl`); everything here needs the `remote`
//! feature.

#[cfg(all(feature = "remote", not(loom)))]
mod breaker;
#[cfg(all(feature = "remote", not(loom)))]
mod fleet_lock;
#[cfg(all(feature = "remote", not(loom)))]
mod names;
#[cfg(all(feature = "remote", not(loom)))]
mod object_lock;
#[cfg(all(feature = "remote", not(loom)))]
mod ops;
#[cfg(all(feature = "remote", not(loom)))]
mod publish;

#[cfg(all(feature = "remote", not(loom)))]
pub use imp::RemoteStore;
#[cfg(all(feature = "remote", not(loom)))]
pub use imp::retention::{GcPolicy, GcReason};

#[cfg(all(feature = "remote", not(loom)))]
mod imp {
    use std::fmt;
    use std::io;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::breaker::Admit;

    mod fleet;
    mod journal;
    mod manifest;
    mod object_wait;
    pub(super) mod retention;
    use super::fleet_lock::FleetLocks;
    pub(crate) use super::names::path_of;
    use super::names::{lock_name, namespace, token};
    use super::ops::{Failure, Ops};
    use super::publish::{Publish, Publisher, Report, Told};
    use crate::cache::Digest;
    use crate::cache::store::StoreKey;
    use crate::cache::store::auth;
    use crate::cache::store::auth::{EntryAuth, Refusal};
    use crate::cache::store::provenance::Provenance;
    use crate::cache::store::{
        Access, BuildLock, LockGuard, PutOutcome, Removal, Store, StoreCounters, StoreEntry,
        StoreHit, StoreKind, StoreStats, StoreWarnings, WarnCause, seal,
    };
    use crate::config::Config;
    use crate::config::RemoteUrl;

    struct Shared {
        ops: Arc<Ops>,
        auth: EntryAuth,
        counters: StoreCounters,
        warnings: StoreWarnings,
        refusals: AtomicU64,
    }

    impl Shared {
        /// Counts `f` (unless the call was skipped) and warns about it once per cause.
        fn failed(&self, what: &str, f: &Failure) {
            if f.skipped {
                return;
            }
            self.counters.error();
            self.warn(what, f);
        }

        fn warn(&self, what: &str, f: &Failure) {
            if !f.skipped {
                self.warnings
                    .warn(f.cause, &format_args!("{what} failed ({})", f.detail));
            }
        }
    }

    /// A remote store. Shared as `Arc<dyn Store>`; every method takes `&self`.
    ///
    /// Guarantees: a hit passed [`auth::open`] for the key asked (MAC when a key is configured, both
    /// checksums, the full key); no method fails the caller; no call waits on the remote longer than
    /// `KPC_CACHE_REMOTE_TIMEOUT` (a fleet lock wait is bounded by `KPC_CACHE_LOCK_TIMEOUT`).
    pub struct RemoteStore {
        url: RemoteUrl,
        shared: Arc<Shared>,
        publisher: Option<Publisher>,
        fleet: Option<FleetLocks>,
        /// The fleet lock of an object store (s3, fs): create-once leases (`object_lock.rs`).
        leases: Option<super::object_lock::ObjectLocks>,
        lock_timeout: Duration,
        /// When this process last recorded a serve of each key (`retention.rs`).
        touched: parking_lot::Mutex<std::collections::HashMap<[u8; 32], Instant>>,
    }

    impl fmt::Debug for RemoteStore {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_tuple("RemoteStore").field(&self.url).finish()
        }
    }

    impl RemoteStore {
        /// The remote `config` names (`KPC_CACHE_REMOTE`), or `None` if none is configured or it
        /// could not be set up (warned once). Nothing is contacted: a remote that is down shows up as
        /// misses.
        pub fn from_config(config: &Config) -> Option<RemoteStore> {
            let url = config.remote.as_ref()?;
            let auth = EntryAuth {
                not_before: config.remote_not_before,
                ..EntryAuth::from_config(config)
            };
            RemoteStore::open_with_sink(
                url,
                config.remote_timeout,
                auth,
                config.lock_timeout,
                config.warning_sink(),
            )
        }

        /// `url`, every call bounded by `timeout`, entries written and read as `auth` says (MAC,
        /// signature, trusted keys; an `Option<MacKey>` converts to MAC only), fleet lock waits bounded
        /// by `lock_timeout`. `None` (warned) if it could not be set up.
        pub fn open(
            url: &RemoteUrl,
            timeout: Duration,
            auth: impl Into<EntryAuth>,
            lock_timeout: Duration,
        ) -> Option<RemoteStore> {
            let sink = crate::warnings::Sink::default();
            RemoteStore::open_with_sink(url, timeout, auth, lock_timeout, sink)
        }

        /// [`RemoteStore::open`], warning through `sink`.
        fn open_with_sink(
            url: &RemoteUrl,
            timeout: Duration,
            auth: impl Into<EntryAuth>,
            lock_timeout: Duration,
            sink: crate::warnings::Sink,
        ) -> Option<RemoteStore> {
            let auth = auth.into();
            let mut warnings = StoreWarnings::new(format!("remote:{url}"));
            warnings.set_sink(sink);
            let ops = match Ops::open(url, timeout) {
                Ok(o) => Arc::new(o),
                Err(e) => {
                    warnings.warn(WarnCause::Unavailable, &e);
                    return None;
                }
            };
            let shared = Arc::new(Shared {
                ops: Arc::clone(&ops),
                auth,
                counters: StoreCounters::default(),
                warnings,
                refusals: AtomicU64::new(0),
            });
            let s = Arc::clone(&shared);
            let report: Report = Arc::new(move |len, r, told| match (r, told) {
                (Ok(()), Told::Count) => s.counters.put(len),
                (Err(f), Told::Count) if !f.skipped => s.counters.error(),
                (Err(f), Told::Unclaimed) if !f.skipped => s.warn("publishing an entry", f),
                _ => {}
            });
            let publisher = Publisher::start(ops, report, timeout);
            let fleet = url
                .redis_connection_url()
                .and_then(|u| FleetLocks::new(&u, timeout).ok());
            let leases = super::object_lock::ObjectLocks::new(url, Arc::clone(&shared.ops));
            Some(RemoteStore {
                url: url.clone(),
                shared,
                publisher,
                fleet,
                leases,
                lock_timeout,
                touched: Default::default(),
            })
        }

        /// The URL (password hidden when displayed).
        pub fn url(&self) -> &RemoteUrl {
            &self.url
        }

        /// Entries refused by [`auth::open`] so far: failed authentication, damage, another key.
        pub fn refusals(&self) -> u64 {
            self.shared.refusals.load(Ordering::Relaxed)
        }

        /// A timeout from OpenDAL's redis pool also means "refused" (it retries connecting until the
        /// timeout): a bare TCP connection tells which, so a remote that is down is reported as such.
        /// Only the connection is tried, for at most a fraction of a second: a frozen server accepts
        /// it (its kernel does), and nothing more is paid waiting for an answer that will not come.
        fn diagnose(&self, mut f: Failure) -> Failure {
            if f.cause != WarnCause::Timeout || f.skipped {
                return f;
            }
            let RemoteUrl::Redis { host, port, .. } = &self.url else {
                return f;
            };
            let wait = Duration::from_millis(200);
            let refused = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))
                .ok()
                .and_then(|mut a| a.next())
                .and_then(|addr| std::net::TcpStream::connect_timeout(&addr, wait).err())
                .is_some_and(|e| e.kind() == io::ErrorKind::ConnectionRefused);
            if refused {
                f.cause = WarnCause::Unavailable;
                f.detail = format!("{} refused the connection", self.url);
            }
            f
        }

        /// Reads and opens `key`'s entry, counting and warning. `poll`: a fleet waiter looking for
        /// the entry again, whose empty answers are not counted as misses (one request, one miss).
        fn fetch_as(&self, key: &StoreKey, poll: bool) -> Option<StoreHit> {
            let sh = &self.shared;
            let value = match sh.ops.read(&path_of(key)) {
                Ok(Some(v)) => v,
                Ok(None) => {
                    if !poll {
                        sh.counters.miss();
                    }
                    return None;
                }
                Err(f) => {
                    sh.counters.miss();
                    sh.failed("a lookup", &self.diagnose(f));
                    return None;
                }
            };
            match auth::open(&sh.auth, key, &value) {
                Ok(hit) => {
                    sh.counters.hit(hit.bytes().len());
                    self.touch(key, false);
                    Some(hit)
                }
                Err(refusal) => {
                    // A poll (a waiter's, or the check after taking the fleet lock) reads again what
                    // this process's lookup already refused and counted: refused again, not counted again.
                    if !poll {
                        sh.counters.miss();
                        sh.counters.error();
                        sh.refusals.fetch_add(1, Ordering::Relaxed);
                        crate::cache::metrics::refused("remote", refusal.reason());
                    }
                    let cause = if refusal.is_signature()
                        || matches!(refusal, Refusal::BeforeCutoff { .. })
                    {
                        WarnCause::Untrusted
                    } else if refusal.is_auth() {
                        WarnCause::Unauthentic
                    } else {
                        WarnCause::Corrupt
                    };
                    sh.warnings.warn(
                        cause,
                        &format_args!("refused the entry for {} ({refusal})", key.digest()),
                    );
                    None
                }
            }
        }

        fn fetch(&self, key: &StoreKey) -> Option<StoreHit> {
            self.fetch_as(key, false)
        }

        /// Every entry the remote holds for the device whose fingerprint digest is `device` (every
        /// device when `None`), as its key record claims (listing does not authenticate; a lookup
        /// does).
        ///
        /// Errors: the remote could not be listed.
        pub fn list_device(&self, device: Option<Digest>) -> io::Result<Vec<StoreEntry>> {
            let mut out = Vec::new();
            for (_, value) in self.values(device)? {
                if let Some(record) = auth::claimed_record(&value) {
                    out.push(StoreEntry {
                        record,
                        bytes: value.len() as u64,
                        last_access: None,
                    });
                }
            }
            Ok(out)
        }

        /// Every object (path and bytes) under the namespace of the device `device` (all if `None`).
        fn values(&self, device: Option<Digest>) -> io::Result<Vec<(String, Vec<u8>)>> {
            let prefix = match device {
                Some(d) => format!("{}{}/", namespace(), d.to_hex()),
                None => namespace(),
            };
            let paths = match &self.fleet {
                Some(f) => f
                    .scan(&format!("{prefix}*"))
                    .map_err(|e| io::Error::other(format!("listing {}: {e}", self.url)))?,
                None => self.shared.ops.list(&prefix)?,
            };
            let mut out = Vec::new();
            for p in paths {
                match self.shared.ops.read(&p) {
                    Ok(Some(v)) => out.push((p, v)),
                    Ok(None) => continue,
                    Err(f) => return Err(io::Error::other(f.detail)),
                }
            }
            Ok(out)
        }

        /// Like [`RemoteStore::list_device`], but each entry is also opened as a lookup would open it
        /// (MAC, signature, trusted keys, checksums, and that it lies under its own key's name): the
        /// verdict and, for an entry that passed, its provenance.
        ///
        /// Errors: the remote could not be listed.
        pub fn list_verified(&self, device: Option<Digest>) -> io::Result<Vec<VerifiedEntry>> {
            let mut out = Vec::new();
            for (p, value) in self.values(device)? {
                let Some(record) = auth::claimed_record(&value) else {
                    continue;
                };
                let verdict = match record.to_key() {
                    None => Err(Refusal::Malformed("malformed key record")),
                    Some(key) if path_of(&key) != p => {
                        Err(Refusal::Malformed("stored under another key's name"))
                    }
                    Some(key) => auth::open_with_provenance(&self.shared.auth, &key, &value)
                        .map(|(_, prov)| prov),
                };
                out.push(VerifiedEntry {
                    entry: StoreEntry {
                        record,
                        bytes: value.len() as u64,
                        last_access: None,
                    },
                    verdict,
                });
            }
            Ok(out)
        }

        fn wait_for_fleet(&self, fleet: &FleetLocks, key: &StoreKey) -> BuildLock {
            let (name, token) = (lock_name(key), token());
            let deadline = Instant::now() + self.lock_timeout;
            let mut pause = Duration::from_millis(10);
            loop {
                let admit = self.shared.ops.breaker.admit();
                if admit == Admit::Skip {
                    return BuildLock::Unavailable;
                }
                let tried = fleet.try_acquire(&name, &token);
                match &tried {
                    Err(e) if super::fleet_lock::unreachable(e) => {
                        self.shared.ops.breaker.failed(admit)
                    }
                    _ => self.shared.ops.breaker.answered(admit),
                }
                match tried {
                    Ok(true) => {
                        let held = fleet.hold(name, token);
                        // Check again even on a first try: between this process's remote miss and
                        // this SET, another machine may have built, published and released the key.
                        // One GET per cold build is what a second build of the same key would cost
                        // the fleet many times over.
                        if let Some(hit) = self.fetch_as(key, true) {
                            return BuildLock::Published(hit);
                        }
                        return BuildLock::Held(LockGuard::new(held));
                    }
                    Ok(false) => {}
                    Err(e) => {
                        self.shared.counters.error();
                        self.shared.warnings.warn(
                            super::fleet_lock::warn_cause(&e),
                            &format_args!("the fleet build lock failed ({e})"),
                        );
                        return BuildLock::Unavailable;
                    }
                }
                if let Some(done) = self.wait_for_holder(key, deadline, &mut pause) {
                    return done;
                }
            }
        }
    }

    /// One remote entry as [`RemoteStore::list_verified`] found it.
    #[derive(Debug, Clone)]
    pub struct VerifiedEntry {
        /// The entry as its key record claims it.
        pub entry: StoreEntry,
        /// `Ok` with its provenance (none for a version-1 envelope) if a lookup would load it, else
        /// why it would be refused.
        pub verdict: Result<Option<Provenance>, Refusal>,
    }

    impl Store for RemoteStore {
        fn name(&self) -> String {
            format!("remote:{}", self.url)
        }

        fn kind(&self) -> StoreKind {
            StoreKind::Remote
        }

        fn get(&self, key: &StoreKey, _access: Access) -> Option<StoreHit> {
            self.fetch(key)
        }

        fn lock_for_build(&self, key: &StoreKey) -> BuildLock {
            // A node that will not publish (trusted keys, no signing key) takes no fleet lock:
            // others would wait for an entry that never comes.
            if !self.shared.auth.may_publish() {
                return BuildLock::NotOffered;
            }
            // The breaker is consulted for every command of the wait.
            match (&self.fleet, &self.leases) {
                (Some(f), _) => self.wait_for_fleet(f, key),
                (None, Some(l)) => self.wait_for_lease(l, key),
                (None, None) => BuildLock::NotOffered,
            }
        }

        fn put(&self, key: &StoreKey, bytes: &[u8], build_time: Duration) -> PutOutcome {
            let Some(publisher) = &self.publisher else {
                return PutOutcome::Skipped;
            };
            // A node that requires signatures and cannot sign (a serving node) publishes nothing:
            // readers like it would refuse the entry, and it would replace a signed one.
            if !self.shared.auth.may_publish() {
                self.shared.warnings.warn(
                    WarnCause::Untrusted,
                    &"KPC_CACHE_TRUSTED_KEYS is set and KPC_CACHE_SIGNING_KEY is not: this node verifies but does not publish what it builds",
                );
                return PutOutcome::Skipped;
            }
            // A build never waits on a remote that just failed: the entry is on the local disk.
            if self.shared.ops.breaker.is_open() {
                self.shared.ops.breaker.count_skip();
                return PutOutcome::Skipped;
            }
            let sh = &self.shared;
            let provenance = Provenance::for_key(&sh.auth.host, key, None, build_time);
            let value = auth::wrap(&sh.auth, key, &seal(key, bytes, build_time), &provenance);
            let published = publisher.publish(path_of(key), value);
            if matches!(published, Publish::Done(Ok(())) | Publish::Pending) {
                // Queued after the entry: its last-served record starts at its publication.
                self.touch(key, true);
            }
            match published {
                Publish::Done(Ok(())) => PutOutcome::Published(0),
                Publish::Done(Err(f)) => {
                    // Counted by the publisher's report; warned here, on the caller's thread.
                    self.shared.warn("publishing an entry", &self.diagnose(f));
                    PutOutcome::Failed
                }
                Publish::Pending => {
                    self.shared.warnings.warn(
                        WarnCause::Timeout,
                        &format_args!(
                            "publishing took longer than KPC_CACHE_REMOTE_TIMEOUT; the build went on and the publish finishes in the background"
                        ),
                    );
                    PutOutcome::Skipped
                }
                Publish::Dropped => {
                    self.shared.counters.error();
                    self.shared.warnings.warn(
                        WarnCause::Timeout,
                        &"the remote is not keeping up with publishing; an entry was not published",
                    );
                    PutOutcome::Failed
                }
            }
        }

        fn remove(&self, key: &StoreKey, what: Removal<'_>) -> bool {
            let path = path_of(key);
            if let Removal::Refused { bytes, reason } = what {
                // Only the exact bytes refused go: a replacement published meanwhile stays.
                let current = match self.shared.ops.read(&path) {
                    Ok(Some(v)) => v,
                    _ => return false,
                };
                match auth::open(&self.shared.auth, key, &current) {
                    Ok(hit) if hit.bytes() == bytes => {}
                    _ => return false,
                }
                self.shared.warnings.warn(
                    WarnCause::Rejected,
                    &format_args!(
                        "the backend refused a verified remote binary ({reason}); removing it"
                    ),
                );
            }
            match self.shared.ops.delete(&path) {
                Ok(()) => true,
                Err(f) => {
                    self.shared.failed("a removal", &f);
                    false
                }
            }
        }

        fn fleet(&self) -> Option<&dyn crate::cache::store::Fleet> {
            Some(self)
        }

        fn list(&self) -> io::Result<Vec<StoreEntry>> {
            self.list_device(None)
        }

        fn stats(&self) -> StoreStats {
            let b = self.shared.ops.breaker.stats();
            StoreStats {
                skipped: b.skipped,
                trips: b.trips,
                ..self.shared.counters.snapshot()
            }
        }
    }
}
