//! What a put into a store did.

/// What a put did. None of these is an error for the caller: the disk cache is an optimization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Published in slot `n`.
    Published(u32),
    /// A valid entry for the key was already there (another process published it first).
    AlreadyPresent,
    /// Not attempted: image size outside the limits, entry larger than `max_size`, or every slot of the
    /// leaf taken.
    Skipped,
    /// Attempted and failed (warned once per cause).
    Failed,
}
