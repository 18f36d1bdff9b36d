//! The causes of this instance's latest counted misses, kept until the build that follows takes its
//! key's (the miss journal records cause and build time together, `crate::cache::journal`). Bounded:
//! past [`MAX_PENDING`] keys nobody took (builds that failed), the oldest half is dropped.

use std::collections::VecDeque;

use parking_lot::Mutex;

use super::{MissCause, StoreKey};
use crate::cache::Digest;

/// Most causes kept waiting for their build.
const MAX_PENDING: usize = 256;

#[derive(Default)]
pub(super) struct RecentCauses(Mutex<VecDeque<(Digest, MissCause)>>);

impl RecentCauses {
    pub(super) fn note(&self, key: &StoreKey, cause: MissCause) {
        let mut q = self.0.lock();
        if q.len() >= MAX_PENDING {
            q.drain(..MAX_PENDING / 2);
        }
        q.push_back((key.digest(), cause));
    }

    pub(super) fn take(&self, key: &StoreKey) -> Option<MissCause> {
        let mut q = self.0.lock();
        let d = key.digest();
        let i = q.iter().rposition(|(k, _)| *k == d)?;
        q.remove(i).map(|(_, c)| c)
    }
}
