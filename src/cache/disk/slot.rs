//! The files of one slot: their paths, listing a leaf's slots, reading a key record, checking a slot
//! in full, and writing and syncing files as a publish needs (removing them is a counted change:
//! `count.rs`).

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::entry::{self, Defect, FileKind, read_verified};
use crate::cache::store::key::{KeyRecord, StoreKey};

/// The state of one slot, checked in full (both files, key binding).
#[derive(Debug)]
pub(crate) enum SlotCheck {
    Absent,
    Valid(Box<KeyRecord>),
    /// `.bin` (or temporaries) without `.src`: invisible to readers; removed by eviction.
    Orphan,
    Defective(FileKind, Defect),
    Unreadable(FileKind, io::Error),
}

pub(crate) fn slot_file(leaf: &Path, n: u32, ext: &str) -> PathBuf {
    leaf.join(format!("{n}.{ext}"))
}

/// The slot numbers of the `<n>.src` files in `leaf`, ascending.
pub(super) fn list_slots(leaf: &Path) -> io::Result<Vec<u32>> {
    let mut v = Vec::new();
    for e in fs::read_dir(leaf)? {
        let e = e?;
        let name = e.file_name();
        if let Some(n) = name
            .to_str()
            .and_then(|s| s.strip_suffix(".src"))
            .and_then(|s| s.parse::<u32>().ok())
        {
            v.push(n);
        }
    }
    v.sort_unstable();
    Ok(v)
}

pub(super) fn read_src(path: &Path) -> io::Result<Result<(entry::Header, KeyRecord), Defect>> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    Ok(match read_verified(&mut f, len, FileKind::Src)? {
        Err(d) => Err(d),
        Ok(v) => match KeyRecord::parse(&v.payload) {
            Some(r) => Ok((v.header, r)),
            None => Err(Defect::BadRecord),
        },
    })
}

/// Checks slot `n` of `leaf` in full. Does not compare with any particular key.
pub(crate) fn check_slot(leaf: &Path, n: u32) -> SlotCheck {
    let src = slot_file(leaf, n, "src");
    let (header, rec) = match read_src(&src) {
        Ok(Ok(x)) => x,
        Ok(Err(d)) => return SlotCheck::Defective(FileKind::Src, d),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let any = ["bin", "src.tmp", "bin.tmp"]
                .iter()
                .any(|ext| slot_file(leaf, n, ext).exists());
            return if any {
                SlotCheck::Orphan
            } else {
                SlotCheck::Absent
            };
        }
        Err(e) => return SlotCheck::Unreadable(FileKind::Src, e),
    };
    match rec.to_key() {
        Some(k) if k.digest().0 == header.key_digest => {}
        _ => return SlotCheck::Defective(FileKind::Src, Defect::KeyMismatch),
    }
    let bin = slot_file(leaf, n, "bin");
    let mut f = match File::open(&bin) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return SlotCheck::Defective(FileKind::Bin, Defect::MissingBin);
        }
        Err(e) => return SlotCheck::Unreadable(FileKind::Bin, e),
    };
    let len = match f.metadata() {
        Ok(m) => m.len(),
        Err(e) => return SlotCheck::Unreadable(FileKind::Bin, e),
    };
    match read_verified(&mut f, len, FileKind::Bin) {
        Ok(Ok(v)) if v.header.key_digest == header.key_digest => SlotCheck::Valid(Box::new(rec)),
        Ok(Ok(_)) => SlotCheck::Defective(FileKind::Bin, Defect::KeyMismatch),
        Ok(Err(d)) => SlotCheck::Defective(FileKind::Bin, d),
        Err(e) => SlotCheck::Unreadable(FileKind::Bin, e),
    }
}

/// Whether `leaf` holds a valid entry (both files checked in full) for exactly `key`. Reads only:
/// counts, repairs and touches nothing.
pub(super) fn holds_valid(leaf: &Path, key: &StoreKey) -> bool {
    list_slots(leaf)
        .unwrap_or_default()
        .into_iter()
        .any(|n| matches!(check_slot(leaf, n), SlotCheck::Valid(rec) if rec.matches(key)))
}

pub(super) fn write_file(path: &Path, header: &[u8], payload: &[u8], sync: bool) -> io::Result<()> {
    use std::io::Write;
    let mut f = File::create(path)?;
    f.write_all(header)?;
    f.write_all(payload)?;
    if sync {
        f.sync_all()?;
    }
    Ok(())
}

pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
