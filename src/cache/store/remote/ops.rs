//! The remote's bytes through OpenDAL's blocking API: read, write, delete and list one path, each
//! bounded by `KPC_CACHE_REMOTE_TIMEOUT` (OpenDAL's timeout layer), with every failure classified
//! into a [`WarnCause`], behind the circuit breaker (`breaker.rs`), so a dead or frozen remote costs
//! one failed call per hold-off instead of one per kernel.

use std::fmt;
use std::io;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use opendal::layers::TimeoutLayer;
use opendal::{ErrorKind, Operator, blocking, services};

use super::breaker::{Admit, Breaker};
use crate::cache::store::WarnCause;
use crate::config::RemoteUrl;

/// The folder, under an `fs://` remote's root, where entries are written before they are renamed
/// into place.
const FS_PARTIAL_DIR: &str = ".kpc-partial";

/// Why a remote call did not succeed.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// The cause it is warned and counted under.
    pub cause: WarnCause,
    /// What happened, for the warning.
    pub detail: String,
    /// The call was not made: the breaker is open after an earlier failure.
    pub skipped: bool,
}

impl Failure {
    /// A call the open breaker did not make.
    pub fn skipped() -> Failure {
        Failure {
            cause: WarnCause::Unavailable,
            detail: "skipped while the remote recovers from an earlier failure".into(),
            skipped: true,
        }
    }

    /// Whether this failure means the remote is unreachable or not answering (what trips the breaker).
    pub fn trips(&self) -> bool {
        matches!(self.cause, WarnCause::Unavailable | WarnCause::Timeout)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

/// `e` with the causes beneath it. OpenDAL's text for an HTTP service (s3) stops at reqwest's "error
/// sending request": that a connection was refused, the one thing that says the server is down, is
/// only in the source chain (hyper's and the OS's errors).
fn describe(e: &opendal::Error) -> String {
    let mut text = format!("{e:#}");
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

fn classify(e: &opendal::Error, text: &str) -> WarnCause {
    let lower = text.to_ascii_lowercase();
    if e.kind() == ErrorKind::PermissionDenied {
        WarnCause::PermissionDenied
    } else if lower.contains("timeout") || lower.contains("timed out") {
        WarnCause::Timeout
    } else if text.contains("OOM") || lower.contains("maxmemory") || lower.contains("no space") {
        WarnCause::NoSpace
    } else if lower.contains("refused")
        || lower.contains("connect")
        || lower.contains("broken pipe")
        || lower.contains("reset")
        || lower.contains("io error")
        || lower.contains("unreachable")
    {
        WarnCause::Unavailable
    } else {
        WarnCause::Io
    }
}

/// The runtime every remote store of the process runs its I/O on: one thread, started with the first
/// store and never stopped. One per store would not do: OpenDAL's HTTP services (s3) share one
/// process-wide client whose pooled connections are driven by the runtime that opened them, so once
/// a store and its runtime were dropped, the next store could be handed such a connection and fail
/// ("dispatch task is gone"); successive contexts of an embedder would see failed lookups.
fn runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kpc-remote-io")
            .enable_all()
            .build()
            .map_err(|e| format!("could not start the remote I/O thread: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// One remote, opened: an OpenDAL operator on the process's remote I/O runtime.
pub(crate) struct Ops {
    op: blocking::Operator,
    /// Shared by every call to this remote: OpenDAL's, the fleet locks', the publisher's.
    pub breaker: Breaker,
}

impl fmt::Debug for Ops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Ops")
    }
}

impl Ops {
    /// Opens `url` with every call bounded by `timeout`. Nothing is contacted yet: an unreachable
    /// remote shows up on the first call.
    ///
    /// Errors: OpenDAL refused the configuration, or no runtime thread could be started.
    pub fn open(url: &RemoteUrl, timeout: Duration) -> Result<Ops, String> {
        let rt = runtime()?;
        let op = match url {
            RemoteUrl::Redis {
                tls,
                host,
                port,
                db,
                user,
                password,
            } => {
                let scheme = if *tls { "rediss" } else { "tcp" };
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                let mut b = opendal_service_redis::Redis::default()
                    .endpoint(&format!("{scheme}://{host}:{port}"))
                    .db(*db);
                if let Some(u) = user {
                    b = b.username(u);
                }
                if let Some(p) = password {
                    b = b.password(p);
                }
                Operator::new(b).map(|o| o.finish())
            }
            // Entries are written to a file in `.kpc-partial` and renamed into place: written in
            // place, a machine reading while another writes saw a short entry (refused as
            // corrupt, then built again). The folder is on the same file system, so the rename
            // is atomic; a writer killed mid-write leaves its file there, never under `kpc/`.
            RemoteUrl::Fs { root } => Operator::new(
                services::Fs::default()
                    .root(&root.to_string_lossy())
                    .atomic_write_dir(&root.join(FS_PARTIAL_DIR).to_string_lossy()),
            )
            .map(|o| o.finish()),
            RemoteUrl::S3 {
                bucket,
                prefix,
                region,
                endpoint,
            } => {
                let mut b = services::S3::default()
                    .bucket(bucket)
                    .root(&format!("/{prefix}"));
                if let Some(r) = region {
                    b = b.region(r);
                }
                if let Some(e) = endpoint {
                    b = b.endpoint(e);
                }
                Operator::new(b).map(|o| o.finish())
            }
        }
        .map_err(|e| format!("OpenDAL refused {url}: {e}"))?;
        let op = op.layer(
            TimeoutLayer::default()
                .with_timeout(timeout)
                .with_io_timeout(timeout),
        );
        let op = {
            let _entered = rt.enter();
            blocking::Operator::new(op).map_err(|e| format!("OpenDAL: {e}"))?
        };
        Ok(Ops {
            op,
            breaker: Breaker::default(),
        })
    }

    /// Runs `f` on the operator, where it can block: on this thread, or on a scoped plain thread
    /// when this one is inside an async runtime (an embedder's), where blocking would panic.
    fn call<T: Send>(
        &self,
        f: impl FnOnce(&blocking::Operator) -> opendal::Result<T> + Send,
    ) -> Result<T, Failure> {
        let admit = self.breaker.admit();
        if admit == Admit::Skip {
            return Err(Failure::skipped());
        }
        let result = if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| f(&self.op))
                    .join()
                    .unwrap_or_else(|_| Err(opendal::Error::new(ErrorKind::Unexpected, "panicked")))
            })
        } else {
            f(&self.op)
        };
        let result = result.map_err(|e| {
            let detail = describe(&e);
            Failure {
                cause: classify(&e, &detail),
                detail,
                skipped: false,
            }
        });
        match &result {
            Err(f) if f.trips() => self.breaker.failed(admit),
            _ => self.breaker.answered(admit),
        }
        result
    }

    /// The value at `path`, `None` if there is none.
    pub fn read(&self, path: &str) -> Result<Option<Vec<u8>>, Failure> {
        self.call(|op| match op.read(path) {
            Ok(b) => Ok(Some(b.to_vec())),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        })
    }

    /// Stores `value` at `path`, replacing what was there.
    pub fn write(&self, path: &str, value: Vec<u8>) -> Result<(), Failure> {
        self.call(|op| op.write(path, value).map(|_| ()))
    }

    /// Whether the service can write an object only if it does not exist yet (OpenDAL's
    /// `write_with_if_not_exists`).
    pub fn creates_once(&self) -> bool {
        self.op.info().full_capability().write_with_if_not_exists
    }

    /// Stores `value` at `path` only if nothing is there: `Ok(false)` if something is.
    pub fn write_if_absent(&self, path: &str, value: Vec<u8>) -> Result<bool, Failure> {
        let opts = opendal::options::WriteOptions {
            if_not_exists: true,
            ..Default::default()
        };
        self.call(|op| match op.write_options(path, value, opts) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::ConditionNotMatch => Ok(false),
            Err(e) => Err(e),
        })
    }

    /// Stores `value` at `path` as a side note (a last-served record): skipped while the breaker is
    /// open, and its outcome does not move the breaker, so a failed note never hides the failure of
    /// the lookup or publish that meets the same remote next (that one trips, counts and warns).
    pub fn write_note(&self, path: &str, value: Vec<u8>) {
        if self.breaker.is_open() {
            return;
        }
        let write = || drop(self.op.write(path, value));
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| drop(s.spawn(write).join()));
        } else {
            write();
        }
    }

    /// Removes `path` (nothing there is not an error).
    pub fn delete(&self, path: &str) -> Result<(), Failure> {
        self.call(|op| op.delete(path))
    }

    /// Every object under `prefix` (recursive) with its length and last modification time, where the
    /// service can list (fs, s3; not redis). Where a listing leaves them out, they are asked for.
    pub fn list_meta(&self, prefix: &str) -> io::Result<Vec<(String, u64, Option<SystemTime>)>> {
        let opts = opendal::options::ListOptions {
            recursive: true,
            ..Default::default()
        };
        let entries = self
            .call(|op| op.list_options(prefix, opts))
            .map_err(|f| io::Error::other(f.detail))?;
        let mut out = Vec::new();
        for e in entries.into_iter().filter(|e| e.metadata().is_file()) {
            let m = e.metadata();
            let mtime = |m: &opendal::Metadata| m.last_modified().map(SystemTime::from);
            let (len, modified) = match (m.content_length(), mtime(m)) {
                (len, Some(t)) if len > 0 => (len, Some(t)),
                _ => match self.stat(e.path()) {
                    Ok(Some(x)) => x,
                    Ok(None) => continue,
                    Err(f) => return Err(io::Error::other(f.detail)),
                },
            };
            out.push((e.path().to_owned(), len, modified));
        }
        Ok(out)
    }

    /// The length and last modification time of `path`, `None` if there is nothing there.
    pub fn stat(&self, path: &str) -> Result<Option<(u64, Option<SystemTime>)>, Failure> {
        self.call(|op| match op.stat(path) {
            Ok(m) => Ok(Some((
                m.content_length(),
                m.last_modified().map(SystemTime::from),
            ))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        })
    }

    /// Every path under `prefix` (recursive), where the service can list (fs, s3; not redis).
    pub fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        let opts = opendal::options::ListOptions {
            recursive: true,
            ..Default::default()
        };
        self.call(|op| op.list_options(prefix, opts))
            .map(|entries| {
                entries
                    .into_iter()
                    .filter(|e| e.metadata().is_file())
                    .map(|e| e.path().to_owned())
                    .collect()
            })
            .map_err(|f| io::Error::other(f.detail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// reqwest's error as OpenDAL wraps it: its text says the send failed, its source says why.
    #[derive(Debug)]
    struct Sending(io::Error);

    impl fmt::Display for Sending {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("error sending request for url (http://127.0.0.1:9/b/k)")
        }
    }

    impl std::error::Error for Sending {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_refused_connection_under_an_http_error_is_unavailable() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = opendal::Error::new(ErrorKind::Unexpected, "send http request")
            .set_source(Sending(refused))
            .set_temporary();
        assert!(!format!("{e:#}").contains("refused"), "{e:#}");
        let text = describe(&e);
        assert!(text.contains("Connection refused"), "{text}");
        assert_eq!(classify(&e, &text), WarnCause::Unavailable);
        // Nothing below it: classified by its own text, as before.
        let plain = opendal::Error::new(ErrorKind::Unexpected, "unexpected reply");
        assert_eq!(classify(&plain, &describe(&plain)), WarnCause::Io);
    }
}
