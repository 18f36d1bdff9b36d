//! The store chain's side of the miss journal (`crate::cache::journal`): a `build` record after each
//! fresh build, `hits` records summing loads, written to the local disk cache's journal and to every
//! level that shares one (a Redis remote).

use std::time::Duration;

use super::StoreChain;
use crate::cache::journal::JournalRecord;
use crate::cache::store::StoreKey;

impl StoreChain {
    /// Records that `key` was built in `took` after every level missed (with the pending `hits`
    /// record, if any). Best effort: a failure is warned about once per cause.
    pub(crate) fn note_built(&self, key: &StoreKey, took: Duration) {
        let layer: Vec<&str> = self
            .levels
            .iter()
            .map(|l| match l.kind {
                super::StoreKind::Disk => "disk",
                super::StoreKind::ReadOnly => "readonly",
                super::StoreKind::Remote => "remote",
                super::StoreKind::Other => "other",
            })
            .collect();
        let mut records = Vec::with_capacity(2);
        records.extend(self.journal.flush());
        records.push(self.journal.built(key, took, layer.join("+")));
        self.write_journal(&records);
    }

    /// A program was loaded from a store: its build time counts as saved in the next `hits` record.
    pub(crate) fn journal_hit(&self, build_time: Duration) {
        if let Some(r) = self.journal.hit(build_time) {
            self.write_journal(&[r]);
        }
    }

    fn write_journal(&self, records: &[JournalRecord]) {
        self.journal
            .write_local(records, |cause, what| self.warnings.warn(cause, &what));
        let lines: Vec<String> = records.iter().map(JournalRecord::to_line).collect();
        for f in self.levels.iter().filter_map(|l| l.store.fleet()) {
            f.share_journal(&lines);
        }
    }
}

impl Drop for StoreChain {
    fn drop(&mut self) {
        if let Some(r) = self.journal.flush() {
            self.write_journal(&[r]);
        }
    }
}
