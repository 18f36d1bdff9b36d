//! One build per key per fleet: a Redis lock per key, through the `redis` crate (OpenDAL does not
//! expose SET NX).
//!
//! - **Take**: `SET <name> <token> NX PX <ttl>`; the token is this holder's alone.
//! - **Keep**: a thread renews the TTL every third of it while the build runs, only if the lock still
//!   holds this token (compare-and-PEXPIRE in one Lua script), so a holder that lost the lock never
//!   extends someone else's.
//! - **Release**: compare-and-delete in one script when the guard drops, so a holder whose lock
//!   expired and was taken over never deletes the new holder's lock.
//! - **Crash**: a killed holder stops renewing; its lock expires after the TTL and the next waiter
//!   takes it.
//!
//! Every command runs on a connection with read, write and connect timeouts of
//! `KPC_CACHE_REMOTE_TIMEOUT`; a failed connection is dropped and made anew on the next call.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// Whether a Redis error says the server is unreachable or slow (the breaker counts it as a failure)
/// rather than that it answered.
pub(crate) fn unreachable(e: &redis::RedisError) -> bool {
    e.is_timeout() || e.is_connection_refusal() || e.is_io_error()
}

/// The warning cause of a failed Redis command: a timeout, a full server (maxmemory, noeviction:
/// it refuses a lock's SET and the journal's XADD as it refuses entries), or unavailable.
pub(crate) fn warn_cause(e: &redis::RedisError) -> crate::cache::store::WarnCause {
    use crate::cache::store::WarnCause;
    if e.is_timeout() {
        WarnCause::Timeout
    } else if e.to_string().contains("OOM") {
        WarnCause::NoSpace
    } else {
        WarnCause::Unavailable
    }
}

/// How long a lock lives without renewal: what a killed builder costs the fleet at most.
pub(crate) const LOCK_TTL: Duration = Duration::from_secs(10);

const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
const RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

/// Connections to one Redis server for fleet locks (and listing, and the fleet's miss journal
/// stream, which OpenDAL's redis service cannot do).
pub(crate) struct FleetLocks {
    client: redis::Client,
    conn: Mutex<Option<redis::Connection>>,
    timeout: Duration,
}

fn connect(client: &redis::Client, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let c = client.get_connection_with_timeout(timeout)?;
    c.set_read_timeout(Some(timeout))?;
    c.set_write_timeout(Some(timeout))?;
    Ok(c)
}

impl FleetLocks {
    /// A client for `url` (a `redis://` URL, password included). Does not connect yet.
    ///
    /// Errors: the `redis` crate does not accept the URL.
    pub fn new(url: &str, timeout: Duration) -> redis::RedisResult<FleetLocks> {
        Ok(FleetLocks {
            client: redis::Client::open(url)?,
            conn: Mutex::new(None),
            timeout,
        })
    }

    /// Runs `f` on the shared connection, connecting first if there is none; a failure drops the
    /// connection so the next call reconnects (Redis restarted, say).
    fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let mut slot = self.conn.lock();
        if slot.is_none() {
            *slot = Some(connect(&self.client, self.timeout)?);
        }
        let r = f(slot.as_mut().expect("connected above"));
        if r.is_err() {
            *slot = None;
        }
        r
    }

    /// Tries once to take lock `name` for `token`. `Ok(false)`: someone else holds it.
    pub(crate) fn try_acquire(&self, name: &str, token: &str) -> redis::RedisResult<bool> {
        self.with_conn(|c| {
            let r: Option<String> = redis::cmd("SET")
                .arg(name)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(LOCK_TTL.as_millis() as u64)
                .query(c)?;
            Ok(r.is_some())
        })
    }

    /// Appends each of `values` to stream `stream` (field `r`), trimming it to about `cap` entries
    /// (`MAXLEN ~`), in one round trip.
    pub(crate) fn append_capped(
        &self,
        stream: &str,
        cap: usize,
        values: &[String],
    ) -> redis::RedisResult<()> {
        self.with_conn(|c| {
            let mut p = redis::pipe();
            for v in values {
                p.cmd("XADD")
                    .arg(stream)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(cap)
                    .arg("*")
                    .arg("r")
                    .arg(v)
                    .ignore();
            }
            p.query::<()>(c)
        })
    }

    /// The last `count` values (field `r`) of stream `stream`, oldest first.
    pub(crate) fn read_stream(
        &self,
        stream: &str,
        count: usize,
    ) -> redis::RedisResult<Vec<String>> {
        self.with_conn(|c| {
            let rows: Vec<(String, Vec<String>)> = redis::cmd("XREVRANGE")
                .arg(stream)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(count)
                .query(c)?;
            Ok(rows
                .into_iter()
                .rev()
                .filter_map(|(_, kv)| {
                    kv.chunks(2)
                        .find(|p| p.len() == 2 && p[0] == "r")
                        .map(|p| p[1].clone())
                })
                .collect())
        })
    }

    /// Keys matching `pattern` (SCAN, so the server is never blocked by a large keyspace).
    pub(crate) fn scan(&self, pattern: &str) -> redis::RedisResult<Vec<String>> {
        self.with_conn(|c| {
            let mut cursor: u64 = 0;
            let mut out = Vec::new();
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query(c)?;
                out.extend(keys);
                if next == 0 {
                    return Ok(out);
                }
                cursor = next;
            }
        })
    }

    /// The length of each of `keys` (STRLEN, pipelined 1000 at a time); 0 for a key that is gone.
    pub(crate) fn strlens(&self, keys: &[String]) -> redis::RedisResult<Vec<u64>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(1000) {
            let lens: Vec<u64> = self.with_conn(|c| {
                let mut p = redis::pipe();
                for k in chunk {
                    p.cmd("STRLEN").arg(k);
                }
                p.query(c)
            })?;
            out.extend(lens);
        }
        Ok(out)
    }

    /// The values of `keys` (MGET, 1000 at a time); `None` for a key that is gone.
    pub(crate) fn mget(&self, keys: &[String]) -> redis::RedisResult<Vec<Option<Vec<u8>>>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(1000) {
            let vals: Vec<Option<Vec<u8>>> =
                self.with_conn(|c| redis::cmd("MGET").arg(chunk).query(c))?;
            out.extend(vals);
        }
        Ok(out)
    }

    /// Holds lock `name` (taken with `token`) until the returned guard drops: renews it from a thread
    /// of its own, then releases it.
    pub fn hold(&self, name: String, token: String) -> HeldFleetLock {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let client = self.client.clone();
        let timeout = self.timeout;
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("kpc-fleet-lock".into())
            .spawn(move || renew_until_stopped(client, timeout, &name, &token, &s));
        HeldFleetLock {
            stop,
            thread: thread.ok(),
        }
    }
}

fn script(
    conn: &mut Option<redis::Connection>,
    client: &redis::Client,
    timeout: Duration,
    cmd: &redis::Cmd,
) -> redis::RedisResult<i64> {
    if conn.is_none() {
        *conn = Some(connect(client, timeout)?);
    }
    let r = cmd.query(conn.as_mut().expect("connected above"));
    if r.is_err() {
        *conn = None;
    }
    r
}

fn renew_until_stopped(
    client: redis::Client,
    timeout: Duration,
    name: &str,
    token: &str,
    stop: &(Mutex<bool>, Condvar),
) {
    let mut conn = None;
    let (flag, cv) = stop;
    loop {
        {
            let mut stopped = flag.lock();
            if !*stopped {
                cv.wait_for(&mut stopped, LOCK_TTL / 3);
            }
            if *stopped {
                break;
            }
        }
        let mut renew = redis::cmd("EVAL");
        renew
            .arg(RENEW)
            .arg(1)
            .arg(name)
            .arg(token)
            .arg(LOCK_TTL.as_millis() as u64);
        // A failed renewal is retried at the next tick; if the lock expires meanwhile, another
        // process builds the key too, which costs time, never correctness.
        if let Ok(0) = script(&mut conn, &client, timeout, &renew) {
            tracing::debug!(target: "kpc::cache::store", lock = name,
                "fleet build lock lost (expired and taken over); building on without it");
            return;
        }
    }
    let mut release = redis::cmd("EVAL");
    release.arg(RELEASE).arg(1).arg(name).arg(token);
    // If this fails the lock expires on its own after LOCK_TTL.
    let _ = script(&mut conn, &client, timeout, &release);
}

/// A fleet build lock held by this process: renewed while it lives, released when it drops.
pub(crate) struct HeldFleetLock {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for HeldFleetLock {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            // Bounded: the release is one command with the remote timeout.
            let _ = t.join();
        }
    }
}
