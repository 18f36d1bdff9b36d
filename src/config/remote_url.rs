//! `KPC_CACHE_REMOTE`: which remote store, parsed strictly and without any network access.
//!
//! Accepted forms: `redis://[user[:password]@]host[:port][/db]` (also `rediss://` for TLS),
//! `fs:///absolute/path` and `s3://bucket[/prefix][?region=R&endpoint=URL]`. Anything else is a
//! [`ConfigError`] naming the variable, what was wrong and what is accepted.

use std::fmt;
use std::path::PathBuf;

use super::{ConfigError, vars};

/// What `KPC_CACHE_REMOTE` accepts, for error messages.
pub(crate) const REMOTE_ACCEPTED: &str = "a URL: redis://host[:port][/db] (rediss:// for TLS; user:password@ before the host if the server needs them), fs:///absolute/path, or s3://bucket[/prefix][?region=REGION&endpoint=URL]";

/// A parsed `KPC_CACHE_REMOTE`. `Debug` and `Display` never show a password.
#[derive(Clone, PartialEq, Eq)]
pub enum RemoteUrl {
    /// A Redis server (the one service with a fleet build lock).
    Redis {
        /// `true` for `rediss://` (TLS).
        tls: bool,
        /// Host name or address (IPv6 without brackets).
        host: String,
        /// TCP port (default 6379).
        port: u16,
        /// Database number (default 0).
        db: i64,
        /// User name, if any.
        user: Option<String>,
        /// Password, if any.
        password: Option<String>,
    },
    /// A directory, shared for example over NFS.
    Fs {
        /// The absolute root directory.
        root: PathBuf,
    },
    /// An S3 (or S3-compatible) bucket. Credentials come from the usual AWS environment variables.
    S3 {
        /// Bucket name.
        bucket: String,
        /// Key prefix inside the bucket (no leading or trailing slash; may be empty).
        prefix: String,
        /// Region, if given.
        region: Option<String>,
        /// Endpoint URL for S3-compatible services, if given.
        endpoint: Option<String>,
    },
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemoteUrl::Redis {
                tls,
                host,
                port,
                db,
                user,
                ..
            } => {
                let scheme = if *tls { "rediss" } else { "redis" };
                let user = user.as_deref().map(|u| format!("{u}@")).unwrap_or_default();
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                write!(f, "{scheme}://{user}{host}:{port}/{db}")
            }
            RemoteUrl::Fs { root } => write!(f, "fs://{}", root.display()),
            RemoteUrl::S3 { bucket, prefix, .. } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

impl fmt::Debug for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteUrl({self})")
    }
}

fn bad(value: &str, problem: &'static str) -> ConfigError {
    ConfigError::InvalidUrl {
        var: vars::CACHE_REMOTE,
        value: redact(value),
        problem,
        accepted: REMOTE_ACCEPTED,
    }
}

/// `value` with the password of a `user:password@` part replaced by `***`.
fn redact(value: &str) -> String {
    let Some((scheme, rest)) = value.split_once("://") else {
        return value.to_owned();
    };
    let auth_end = rest.find('/').unwrap_or(rest.len());
    match rest[..auth_end].rfind('@') {
        Some(at) => {
            let auth = &rest[..at];
            let user = auth.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***{}", &rest[at..])
        }
        None => value.to_owned(),
    }
}

impl RemoteUrl {
    /// Parses a `KPC_CACHE_REMOTE` value.
    ///
    /// Errors: [`ConfigError::InvalidUrl`] for `KPC_CACHE_REMOTE` saying what is wrong (an
    /// unknown scheme, a missing host or bucket, a bad port or database number, a relative fs path,
    /// an unknown s3 parameter), with the password redacted.
    pub fn parse(value: &str) -> Result<RemoteUrl, ConfigError> {
        let v = value.trim();
        let Some((scheme, rest)) = v.split_once("://") else {
            return Err(bad(value, "has no scheme (no \"://\")"));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "redis" => parse_redis(value, rest, false),
            "rediss" => parse_redis(value, rest, true),
            "fs" | "file" => {
                if rest.is_empty() || !rest.starts_with('/') {
                    return Err(bad(
                        value,
                        "needs an absolute path (fs:///path: three slashes)",
                    ));
                }
                if rest.contains('?') {
                    return Err(bad(value, "takes no parameters"));
                }
                Ok(RemoteUrl::Fs {
                    root: PathBuf::from(rest),
                })
            }
            "s3" => parse_s3(value, rest),
            _ => Err(bad(
                value,
                "has an unsupported scheme (redis, rediss, fs and s3 are supported)",
            )),
        }
    }

    /// Whether this remote offers the fleet build lock (Redis only).
    pub fn has_fleet_lock(&self) -> bool {
        matches!(self, RemoteUrl::Redis { .. })
    }

    /// The URL the `redis` crate connects to, password included; `None` for other services.
    pub fn redis_connection_url(&self) -> Option<String> {
        let RemoteUrl::Redis {
            tls,
            host,
            port,
            db,
            user,
            password,
        } = self
        else {
            return None;
        };
        let scheme = if *tls { "rediss" } else { "redis" };
        let auth = match (user, password) {
            (Some(u), Some(p)) => format!("{u}:{p}@"),
            (Some(u), None) => format!("{u}@"),
            (None, Some(p)) => format!(":{p}@"),
            (None, None) => String::new(),
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        Some(format!("{scheme}://{auth}{host}:{port}/{db}"))
    }
}

fn parse_redis(value: &str, rest: &str, tls: bool) -> Result<RemoteUrl, ConfigError> {
    if rest.contains('?') || rest.contains('#') {
        return Err(bad(value, "takes no parameters"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (auth, hostport) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (user, password) = match auth {
        None => (None, None),
        Some(a) => {
            let (u, p) = match a.split_once(':') {
                Some((u, p)) => (u, Some(p.to_owned())),
                None => (a, None),
            };
            ((!u.is_empty()).then(|| u.to_owned()), p)
        }
    };
    let (host, port) = if let Some(h) = hostport.strip_prefix('[') {
        let Some((h, after)) = h.split_once(']') else {
            return Err(bad(value, "has an unclosed '[' in its host"));
        };
        (h, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(bad(value, "has no host"));
    }
    let port = match port {
        None => 6379,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad(value, "has a port that is not a number in 1..=65535"))?,
    };
    let db = match path.trim_end_matches('/') {
        "" => 0,
        d => d.parse::<i64>().ok().filter(|&d| d >= 0).ok_or_else(|| {
            bad(
                value,
                "has a database that is not a number (redis://host:port/DB)",
            )
        })?,
    };
    Ok(RemoteUrl::Redis {
        tls,
        host: host.to_owned(),
        port,
        db,
        user,
        password,
    })
}

fn parse_s3(value: &str, rest: &str) -> Result<RemoteUrl, ConfigError> {
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let (bucket, prefix) = match path.split_once('/') {
        Some((b, p)) => (b, p.trim_matches('/')),
        None => (path, ""),
    };
    if bucket.is_empty() {
        return Err(bad(value, "has no bucket (s3://bucket/prefix)"));
    }
    let (mut region, mut endpoint) = (None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("region", r)) if !r.is_empty() => region = Some(r.to_owned()),
            Some(("endpoint", e)) if e.starts_with("http://") || e.starts_with("https://") => {
                endpoint = Some(e.to_owned())
            }
            Some(("endpoint", _)) => {
                return Err(bad(value, "has an endpoint that is not an http(s):// URL"));
            }
            _ => {
                return Err(bad(
                    value,
                    "has an unknown or empty parameter (region=.. and endpoint=.. are accepted)",
                ));
            }
        }
    }
    Ok(RemoteUrl::S3 {
        bucket: bucket.to_owned(),
        prefix: prefix.to_owned(),
        region,
        endpoint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(v: &str) -> &'static str {
        match RemoteUrl::parse(v).unwrap_err() {
            ConfigError::InvalidUrl { var, problem, .. } => {
                assert_eq!(var, "KPC_CACHE_REMOTE");
                problem
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn parses_the_three_services() {
        assert_eq!(
            RemoteUrl::parse("redis://127.0.0.1:7000/3").unwrap(),
            RemoteUrl::Redis {
                tls: false,
                host: "127.0.0.1".into(),
                port: 7000,
                db: 3,
                user: None,
                password: None
            }
        );
        let r = RemoteUrl::parse("rediss://u:secret@cache.example").unwrap();
        assert_eq!(
            r.redis_connection_url().unwrap(),
            "rediss://u:secret@cache.example:6379/0"
        );
        assert!(!format!("{r} {r:?}").contains("secret"));
        assert_eq!(
            RemoteUrl::parse("fs:///srv/kpc").unwrap(),
            RemoteUrl::Fs {
                root: "/srv/kpc".into()
            }
        );
        assert_eq!(
            RemoteUrl::parse("s3://b/p/q/?region=eu-west-1&endpoint=http://127.0.0.1:9000")
                .unwrap(),
            RemoteUrl::S3 {
                bucket: "b".into(),
                prefix: "p/q".into(),
                region: Some("eu-west-1".into()),
                endpoint: Some("http://127.0.0.1:9000".into())
            }
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        assert!(problem("localhost:6379").contains("no scheme"));
        assert!(problem("http://x").contains("unsupported scheme"));
        assert!(problem("redis://:6379").contains("no host"));
        assert!(problem("redis://h:99999").contains("port"));
        assert!(problem("redis://h:1/x").contains("database"));
        assert!(problem("fs://relative").contains("absolute"));
        assert!(problem("s3:///p").contains("bucket"));
        assert!(problem("s3://b?colour=red").contains("unknown"));
        assert!(problem("s3://b?endpoint=ftp://x").contains("endpoint"));
        let e = RemoteUrl::parse("redis://u:hunter2@:1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
