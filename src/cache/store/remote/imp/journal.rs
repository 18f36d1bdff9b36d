//! The remote's share of the miss journal (`crate::cache::journal`): a Redis remote appends the
//! records to the stream [`JOURNAL_STREAM`], capped (`MAXLEN ~`) at
//! [`FLEET_RECORDS`](crate::cache::journal::FLEET_RECORDS), behind the breaker; `kpc cache report
//! --remote` reads it back. fs and s3 remotes keep none.

use std::io;

use super::super::breaker::Admit;
use super::RemoteStore;
use crate::cache::store::WarnCause;

/// The Redis stream holding the fleet's miss journal.
pub(crate) const JOURNAL_STREAM: &str = "kpc-journal/v1";

impl RemoteStore {
    pub(super) fn append_journal(&self, lines: &[String]) {
        let Some(fleet) = &self.fleet else {
            return;
        };
        // Journal records are not store calls: while the breaker is open they are dropped without
        // counting a skip, and they never probe it.
        if self.shared.ops.breaker.is_open() || lines.is_empty() {
            return;
        }
        let admit = Admit::Call;
        let r = fleet.append_capped(JOURNAL_STREAM, crate::cache::journal::FLEET_RECORDS, lines);
        match &r {
            Err(e) if e.is_timeout() || e.is_connection_refusal() || e.is_io_error() => {
                self.shared.ops.breaker.failed(admit)
            }
            _ => self.shared.ops.breaker.answered(admit),
        }
        if let Err(e) = r {
            let cause = if e.is_timeout() {
                WarnCause::Timeout
            } else if e.to_string().contains("OOM") {
                // A full Redis (maxmemory, noeviction) refuses the XADD as it refuses entries.
                WarnCause::NoSpace
            } else {
                WarnCause::Unavailable
            };
            self.shared.warnings.warn(
                cause,
                &format_args!("sharing the miss journal failed ({e})"),
            );
        }
    }

    pub(super) fn fleet_journal(&self) -> Option<io::Result<Vec<String>>> {
        let fleet = self.fleet.as_ref()?;
        Some(
            fleet
                .read_stream(JOURNAL_STREAM, crate::cache::journal::FLEET_RECORDS)
                .map_err(|e| io::Error::other(format!("{}: {e}", self.url))),
        )
    }
}
