//! A real S3-compatible server for remote-tier tests: each test starts its own s3rver (npm's
//! `s3rver`, installed by scripts/setup.sh; BENCHMARKS.md says why this one) on a free loopback port
//! with its own data directory, creates the bucket, and kills it when the handle drops.
//!
//! s3rver is a test tool like a driver: where it is missing the test is reported skipped
//! (`skipped s3 <test>` in `KPC_TEST_DRIVER_LOG`), which fails CI (scripts/test.sh), and under
//! `KPC_TEST_REQUIRE_DRIVERS=1` the test fails outright.
//!
//! The test's own requests (bucket creation, listing, reading and replacing objects) are plain
//! unsigned HTTP/1.1 over a `TcpStream`: s3rver lets anonymous requests through, and this keeps an S3
//! client out of the tests. kpc's requests are signed (SigV4) with the credentials of
//! [`S3Server::credentials`], which s3rver checks.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::disk::TempDir;
use super::drivers::{ran, skip};

/// The bucket every test server holds.
pub const BUCKET: &str = "kpc-test";

/// The one key pair s3rver accepts (its built-in account).
const ACCESS_KEY: &str = "S3RVER";
const SECRET_KEY: &str = "S3RVER";

/// A running s3rver, killed on drop.
pub struct S3Server {
    child: Option<Child>,
    port: u16,
    _dir: TempDir,
}

fn free_port() -> u16 {
    // The port is free when the listener drops; s3rver binds it a moment later. Another process
    // taking it in between makes s3rver exit at start, which `wait_ready` reports.
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `s3rver` on `PATH` (npm's global bin directory, where scripts/setup.sh installs it).
fn s3rver() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("s3rver"))
        .find(|p| p.is_file())
}

/// One HTTP response: status and body.
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl S3Server {
    /// Starts a server for `test`, or reports the test skipped if s3rver is not installed.
    pub fn start(test: &str) -> Option<S3Server> {
        let Some(bin) = s3rver() else {
            return skip(
                "s3",
                test,
                "s3rver is not on PATH (scripts/setup.sh installs it with npm)",
            );
        };
        let dir = TempDir::new("s3rver");
        let port = free_port();
        let child = Command::new(bin)
            .arg("--directory")
            .arg(dir.path())
            .args(["--address", "127.0.0.1", "--port", &port.to_string()])
            .arg("--silent")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start s3rver");
        let mut s = S3Server {
            child: Some(child),
            port,
            _dir: dir,
        };
        s.wait_ready();
        ran("s3", test);
        Some(s)
    }

    /// Creates the bucket, retrying until the server answers: the first success is the moment it is
    /// ready.
    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("s3rver on port {} exited at start ({st})", self.port);
            }
            if let Ok(r) = self.request("PUT", &format!("/{BUCKET}"), &[]) {
                assert_eq!(r.status, 200, "create bucket: {}", r.text());
                return;
            }
            // A bound so a wedged server fails the test instead of hanging CI.
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "s3rver never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `s3://kpc-test/PREFIX?region=us-east-1&endpoint=http://127.0.0.1:PORT`, for `KPC_CACHE_REMOTE`.
    pub fn url(&self, prefix: &str) -> String {
        url_at(self.port, prefix)
    }

    /// The variables a kpc process needs to sign its requests for this server, and the removal of any
    /// other AWS setting the test's environment has (a profile, a session token, an endpoint).
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
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/nonexistent/kpc-test-aws-config")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/kpc-test-aws-credentials")
    }

    /// One unsigned request to the server, `Connection: close`.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> std::io::Result<Response> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        );
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)?;
        parse_response(&raw)
    }

    /// Every object key under `prefix`, sorted (ListObjectsV2; the test's objects fit one page).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let r = self
            .request(
                "GET",
                &format!("/{BUCKET}?list-type=2&max-keys=1000&prefix={prefix}"),
                &[],
            )
            .expect("list the test bucket");
        assert_eq!(r.status, 200, "list: {}", r.text());
        let text = r.text();
        let mut keys: Vec<String> = text
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_owned()))
            .collect();
        keys.sort();
        keys
    }

    /// The object at `key`.
    pub fn get(&self, key: &str) -> Vec<u8> {
        let r = self
            .request("GET", &format!("/{BUCKET}/{key}"), &[])
            .expect("read an object");
        assert_eq!(r.status, 200, "get {key}: {}", r.text());
        r.body
    }

    /// Stores `value` at `key`, replacing what was there.
    pub fn put(&self, key: &str, value: &[u8]) {
        let r = self
            .request("PUT", &format!("/{BUCKET}/{key}"), value)
            .expect("write an object");
        assert_eq!(r.status, 200, "put {key}: {}", r.text());
    }

    /// Kills the server now (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Response {
    /// The body as text, for messages and XML.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
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

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

/// Status and body of a whole HTTP/1.1 response (the connection was closed after it).
fn parse_response(raw: &[u8]) -> std::io::Result<Response> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut rest = &raw[end + 4..];
    if !chunked {
        return Ok(Response {
            status,
            body: rest.to_vec(),
        });
    }
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("truncated chunk"))?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("bad chunk size"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(Response { status, body });
        }
        if rest.len() < size + 2 {
            return Err(bad("truncated chunk"));
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}
