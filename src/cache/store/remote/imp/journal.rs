//! The remote's share of the miss journal (`crate::cache::journal`): a Redis remote appends the
//! records to the stream [`JOURNAL_STREAM`], capped (`MAXLEN ~`) at
//! [`FLEET_RECORDS`](crate::cache::journal::FLEET_RECORDS), behind the breaker; an fs or s3 remote,
//! which has no append, keeps one object per host id under the same name, its last
//! [`HOST_RECORDS`] records, rewritten at each share. `kpc cache report --remote` reads them back.

use std::io;

use super::super::breaker::Admit;
use super::RemoteStore;

/// The Redis stream holding the fleet's miss journal (on fs and s3, the folder of per-host objects).
pub(crate) const JOURNAL_STREAM: &str = "kpc-journal/v1";

/// Records an fs or s3 remote keeps per host: the fleet's bound split over a few dozen machines.
pub(crate) const HOST_RECORDS: usize = 1024;

/// Where an fs or s3 remote keeps host `host`'s records: named by a digest, since a host id may
/// hold any character but control characters.
fn host_object(host: &str) -> String {
    format!(
        "{JOURNAL_STREAM}/{}",
        &blake3::hash(host.as_bytes()).to_hex()[..32]
    )
}

impl RemoteStore {
    pub(super) fn append_journal(&self, lines: &[String]) {
        // Journal records are not store calls: while the breaker is open they are dropped without
        // counting a skip, and they never probe it.
        if self.shared.ops.breaker.is_open() || lines.is_empty() {
            return;
        }
        let Some(fleet) = &self.fleet else {
            return self.append_host_object(lines);
        };
        let admit = Admit::Call;
        let r = fleet.append_capped(JOURNAL_STREAM, crate::cache::journal::FLEET_RECORDS, lines);
        match &r {
            Err(e) if super::super::fleet_lock::unreachable(e) => {
                self.shared.ops.breaker.failed(admit)
            }
            _ => self.shared.ops.breaker.answered(admit),
        }
        if let Err(e) = r {
            self.shared.warnings.warn(
                super::super::fleet_lock::warn_cause(&e),
                &format_args!("sharing the miss journal failed ({e})"),
            );
        }
    }

    pub(super) fn fleet_journal(&self) -> Option<io::Result<Vec<String>>> {
        let Some(fleet) = self.fleet.as_ref() else {
            return Some(self.read_host_objects());
        };
        Some(
            fleet
                .read_stream(JOURNAL_STREAM, crate::cache::journal::FLEET_RECORDS)
                .map_err(|e| io::Error::other(format!("{}: {e}", self.url))),
        )
    }

    /// fs and s3: this host's object gets `lines` after its last records. Machines never write one
    /// another's objects; two processes of one host that share at the same moment may lose one
    /// batch (the last write wins), which costs the report those records only.
    fn append_host_object(&self, lines: &[String]) {
        let (path, ops) = (host_object(&self.shared.auth.host), &self.shared.ops);
        let mut records: Vec<String> = match ops.read(&path) {
            Ok(old) => old
                .map(|b| {
                    String::from_utf8_lossy(&b)
                        .lines()
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            Err(f) => {
                return self
                    .shared
                    .warn("sharing the miss journal", &self.diagnose(f));
            }
        };
        records.extend(lines.iter().cloned());
        records.drain(..records.len().saturating_sub(HOST_RECORDS));
        let body = records.join("\n") + "\n";
        if let Err(f) = ops.write(&path, body.into_bytes()) {
            self.shared
                .warn("sharing the miss journal", &self.diagnose(f));
        }
    }

    /// fs and s3: every host's records.
    fn read_host_objects(&self) -> io::Result<Vec<String>> {
        let ops = &self.shared.ops;
        let mut out = Vec::new();
        for path in ops.list(&format!("{JOURNAL_STREAM}/"))? {
            match ops.read(&path) {
                Ok(Some(b)) => out.extend(String::from_utf8_lossy(&b).lines().map(str::to_owned)),
                Ok(None) => {}
                Err(f) => return Err(io::Error::other(format!("{}: {}", self.url, f.detail))),
            }
        }
        Ok(out)
    }
}
