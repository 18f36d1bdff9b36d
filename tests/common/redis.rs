//! A real redis-server for remote-tier tests: each test starts its own on a free loopback port, with no
//! persistence (`--save "" --appendonly no`) and its own directory, waits for PING, and kills it when
//! the handle drops.
//!
//! redis-server is a test tool like a driver: where it is missing the test is reported skipped
//! (`skipped redis <test>` in `KPC_TEST_DRIVER_LOG`), which fails CI (scripts/test.sh), and under
//! `KPC_TEST_REQUIRE_DRIVERS=1` the test fails outright.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::disk::TempDir;
use super::drivers::{ran, skip};

/// Where the Debian package (scripts/setup.sh) installs it.
const REDIS_SERVER: &str = "/usr/bin/redis-server";

/// A running redis-server, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    _dir: TempDir,
}

fn free_port() -> u16 {
    // The port is free when the listener drops; redis-server binds it a moment later. Another
    // process taking it in between makes redis-server fail to start, which `start` reports.
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    /// Starts a server for `test`, or reports the test skipped if redis-server is not installed.
    pub fn start(test: &str) -> Option<RedisServer> {
        if !Path::new(REDIS_SERVER).exists() {
            return skip(
                "redis",
                test,
                "redis-server is not installed (scripts/setup.sh installs Debian's redis-server)",
            );
        }
        let s = RedisServer::spawn(&[]);
        ran("redis", test);
        Some(s)
    }

    /// Starts a server with `extra` arguments (e.g. `["--maxmemory", "2mb"]`).
    pub fn spawn(extra: &[&str]) -> RedisServer {
        let dir = TempDir::new("redis");
        let port = free_port();
        let child = Command::new(REDIS_SERVER)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let mut s = RedisServer {
            child: Some(child),
            port,
            _dir: dir,
        };
        s.wait_for_ping();
        s
    }

    fn wait_for_ping(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("redis-server on port {} exited at start ({st})", self.port);
            }
            if let Ok(mut c) = self.connection() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return;
                }
            }
            // A bound so a wedged server fails the test instead of hanging CI.
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "redis-server never answered PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/0`, for `KPC_CACHE_REMOTE`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// A fresh connection for the test's own commands.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let c = redis::Client::open(self.url())?;
        c.get_connection_with_timeout(Duration::from_secs(5))
    }

    /// Runs one command and returns its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&[u8]]) -> T {
        let mut c = self.connection().expect("connect to the test redis-server");
        let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut c).expect("redis command")
    }

    /// Every key matching `pattern`.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut k: Vec<String> = self.cmd(&[b"KEYS", pattern.as_bytes()]);
        k.sort();
        k
    }

    /// The value at `key`.
    pub fn get(&self, key: &str) -> Vec<u8> {
        self.cmd(&[b"GET", key.as_bytes()])
    }

    /// Stores `value` at `key`.
    pub fn set(&self, key: &str, value: &[u8]) {
        let _: String = self.cmd(&[b"SET", key.as_bytes(), value]);
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let st = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(st.success(), "kill -{signal} {pid}");
    }

    /// Kills the server now (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The directory the server runs in.
    pub fn dir(&self) -> PathBuf {
        self._dir.path().to_path_buf()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            // A stopped server must be continued before it can be waited for after the kill.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A loopback URL on which nothing listens: a remote that is down.
pub fn dead_url() -> String {
    format!("redis://127.0.0.1:{}/0", free_port())
}
