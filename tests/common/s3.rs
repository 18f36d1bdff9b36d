//! A real S3-compatible server for remote-tier tests: each test starts its own s3s-fs (crates.io's
//! `s3s-fs`, installed by scripts/test.sh; BENCHMARKS.md says why this one) on a free loopback port
//! with its own data directory and bucket, and kills it when the handle drops.
//!
//! s3s-fs is a test tool like a driver: where it is missing the test is reported skipped
//! (`skipped s3 <test>` in `KPC_TEST_DRIVER_LOG`), which fails CI (scripts/test.sh), and under
//! `KPC_TEST_REQUIRE_DRIVERS=1` the test fails outright.
//!
//! The server checks every request's SigV4 signature against one key pair, so kpc's requests carry
//! the credentials of [`S3Server::credentials`] as a fleet member's would. The test itself never
//! speaks S3: s3s-fs keeps each object as a plain file `<data>/<bucket>/<key>`, so the bucket is a
//! directory made before the start, and the test lists, reads and replaces objects as files, which is
//! what another writer of the bucket would do through the server.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::disk::TempDir;
use super::drivers::{ran, skip};

/// The bucket every test server holds.
pub const BUCKET: &str = "kpc-test";

/// The one key pair the test servers accept.
const ACCESS_KEY: &str = "kpc-test-access";
const SECRET_KEY: &str = "kpc-test-secret";

/// A running s3s-fs, killed on drop.
pub struct S3Server {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

fn free_port() -> u16 {
    // The port is free when the listener drops; s3s-fs binds it a moment later. Another process
    // taking it in between makes s3s-fs exit at start, which `wait_ready` reports.
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `s3s-fs` on `PATH`, or in cargo's bin directory (where `cargo install` in scripts/test.sh puts it)
/// when a test runs outside a shell that has it on `PATH`.
fn s3s_fs() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|c| c.join("bin"));
    on_path
        .into_iter()
        .chain(cargo_bin)
        .map(|d| d.join("s3s-fs"))
        .find(|p| p.is_file())
}

impl S3Server {
    /// Starts a server for `test`, or reports the test skipped if s3s-fs is not installed.
    pub fn start(test: &str) -> Option<S3Server> {
        let Some(bin) = s3s_fs() else {
            return skip(
                "s3",
                test,
                "s3s-fs is not installed (scripts/test.sh builds it with cargo install)",
            );
        };
        let dir = TempDir::new("s3s-fs");
        std::fs::create_dir_all(dir.join(BUCKET)).unwrap();
        let port = free_port();
        let child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        let mut s = S3Server {
            child: Some(child),
            port,
            dir,
        };
        s.wait_ready();
        ran("s3", test);
        Some(s)
    }

    /// Waits for the server's first HTTP answer (an unsigned request: refused, but answered).
    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("s3s-fs on port {} exited at start ({st})", self.port);
            }
            if self.answers() {
                return;
            }
            // A bound so a wedged server fails the test instead of hanging CI.
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "s3s-fs never answered"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let req = format!(
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        );
        let mut head = [0u8; 12];
        s.write_all(req.as_bytes()).is_ok()
            && s.read_exact(&mut head).is_ok()
            && head.starts_with(b"HTTP/1.1 ")
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `s3://kpc-test/PREFIX?region=us-east-1&endpoint=http://127.0.0.1:PORT`, for `KPC_CACHE_REMOTE`.
    pub fn url(&self, prefix: &str) -> String {
        url_at(self.port, prefix)
    }

    /// Gives `cmd` the credentials the test servers accept, and removes any other AWS setting the
    /// test's environment has (a profile, a session token, an endpoint, credential files), so that
    /// what kpc signs with is exactly these.
    pub fn credentials(cmd: &mut Command) -> &mut Command {
        for v in [
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT",
            "AWS_S3_ENDPOINT",
            "AWS_ROLE_ARN",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
        ] {
            cmd.env_remove(v);
        }
        cmd.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_CONFIG_FILE", "/nonexistent/kpc-test-aws-config")
            .env(
                "AWS_SHARED_CREDENTIALS_FILE",
                "/nonexistent/kpc-test-aws-credentials",
            )
    }

    fn object_path(&self, key: &str) -> PathBuf {
        self.dir.join(BUCKET).join(key)
    }

    /// Every object key under `prefix` (a directory-like prefix: `fleet/`), sorted.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let key = format!("{rel}{name}");
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), &format!("{key}/"), out);
                } else {
                    out.push(key);
                }
            }
        }
        let mut keys = Vec::new();
        walk(&self.object_path(prefix), prefix, &mut keys);
        keys.sort();
        keys
    }

    /// The object at `key`.
    pub fn get(&self, key: &str) -> Vec<u8> {
        std::fs::read(self.object_path(key)).expect("read an object")
    }

    /// Replaces the object at `key` with `value` (a new file renamed over it, so the server never
    /// serves half of it).
    pub fn put(&self, key: &str, value: &[u8]) {
        let path = self.object_path(key);
        let tmp = path.with_extension("kpc-test-tmp");
        std::fs::write(&tmp, value).expect("write an object");
        std::fs::rename(&tmp, &path).expect("replace an object");
    }

    /// Sets the modification time of the object at `key`, which the server reports as its
    /// LastModified: what another writer's object of that age looks like.
    pub fn backdate(&self, key: &str, to: std::time::SystemTime) {
        filetime::set_file_mtime(
            self.object_path(key),
            filetime::FileTime::from_system_time(to),
        )
        .expect("set an object's modification time");
    }

    /// Removes the object at `key`, as another client's DELETE would.
    pub fn remove(&self, key: &str) {
        std::fs::remove_file(self.object_path(key)).expect("remove an object");
    }

    /// Whether there is an object at `key`.
    pub fn exists(&self, key: &str) -> bool {
        self.object_path(key).is_file()
    }

    /// Kills the server now (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn url_at(port: u16, prefix: &str) -> String {
    format!("s3://{BUCKET}/{prefix}?region=us-east-1&endpoint=http://127.0.0.1:{port}")
}

/// A loopback S3 URL on which nothing listens: a remote that is down.
pub fn dead_url(prefix: &str) -> String {
    url_at(free_port(), prefix)
}
