//! The name index: for each device directory, which image directories were made for which image
//! name (the key's label). A miss explanation uses it to find the earlier versions of a changed image
//! (an edited shader, an edited include) by reading one small file, however many images the device
//! directory holds.
//!
//! ```text
//! <root>/v1/names/<device>   one line per image directory made: "<image> <label hash>\n"
//! ```
//! Both fields are 16 hex characters (the image directory's name, and 8 bytes of BLAKE3 over the
//! label), so every line is [`LINE`] bytes.
//!
//! - **Written** by a writer that is about to make an image directory, *before* it makes it: a crash
//!   in between leaves a line for a directory that does not exist (dropped by the next compaction),
//!   never a directory the index lacks. Appends happen under a `flock` on the index file, so lines
//!   never interleave; a line torn by a crash is skipped by readers, and the lines after it still
//!   parse (each is read back from its newline).
//! - **Read** without a lock, whole, up to [`MAX_INDEX_BYTES`]. An index is a hint: every image
//!   directory it names is still checked, and its entries' key records compared in full.
//! - **Compacted** by the eviction sweep (which holds the eviction lock, so one compaction runs at a
//!   time): lines whose image directory is gone, and duplicates (an image directory made again after
//!   an eviction), are dropped by writing the file anew and renaming it into place under its lock. A
//!   writer that was waiting for the lock then finds the path names another file and opens it again
//!   (`lock.rs`), so no line is lost. An index left with no lines is removed.
//!
//! Images without a name (an empty label) are not indexed: a miss is explained by the image's name
//! only when it has one. Device directories written before kpc kept an index have none, and are
//! searched as before (`nearest.rs`).

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use super::lock::{self, Waited};
use crate::cache::Digest;
use crate::cache::store::key::DIR_HEX_BYTES;

/// The directory under `<root>/v1` holding one index per device directory.
pub(crate) const NAMES_DIR: &str = "names";
/// Bytes of one line: two names of 16 hex characters, a space and a newline.
pub(crate) const LINE: usize = 4 * DIR_HEX_BYTES + 2;
/// Most bytes of one index a reader reads (about 120,000 image directories).
pub(crate) const MAX_INDEX_BYTES: u64 = 4 << 20;
/// An index is locked for one append or one rewrite; waiting longer means something is wrong, and
/// the line is dropped (the explanation then falls short, nothing else).
const LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// The label's field in the index.
pub(crate) fn label_hash(label: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"kpc-label-v1\0");
    h.update(label.as_bytes());
    Digest(*h.finalize().as_bytes()).short_hex(DIR_HEX_BYTES)
}

fn is_name(s: &[u8]) -> bool {
    s.len() == 2 * DIR_HEX_BYTES && s.iter().all(|b| b.is_ascii_hexdigit())
}

/// The (image, label hash) pairs of an index's bytes, in order. Each line is taken from its newline
/// backwards, so a torn line (a crash mid-append) costs only itself.
fn parse(bytes: &[u8]) -> Vec<(&str, &str)> {
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| l.len() >= LINE - 1)
        .filter_map(|l| {
            let l = &l[l.len() - (LINE - 1)..];
            let (img, rest) = l.split_at(2 * DIR_HEX_BYTES);
            let label = rest.strip_prefix(b" ")?;
            (is_name(img) && is_name(label)).then(|| {
                (
                    std::str::from_utf8(img).expect("hex"),
                    std::str::from_utf8(label).expect("hex"),
                )
            })
        })
        .collect()
}

/// Records that image directory `image` of device directory `device` is being made for entries of
/// image name `label`. Best effort: an error means this image's earlier versions will not be found
/// by name, nothing more.
pub(crate) fn record(v1: &Path, device: &str, image: &str, label: &str) -> io::Result<()> {
    if label.is_empty() {
        return Ok(());
    }
    let dir = v1.join(NAMES_DIR);
    let path = dir.join(device);
    fs::create_dir_all(&dir)?;
    // The directory goes when a compaction removed the last index; make it again and retry.
    let held = lock::lock_with_timeout(&path, false, LOCK_TIMEOUT, || fs::create_dir_all(&dir))?;
    let Waited::Acquired { lock, .. } = held else {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "the name index stayed locked",
        ));
    };
    let mut f = lock.file();
    let mut line = String::with_capacity(LINE + 1);
    // A torn last line (a crash mid-append) gets its newline, so this one starts a line of its own.
    if f.seek(SeekFrom::End(0))? > 0 {
        let mut last = [0u8];
        f.seek(SeekFrom::End(-1))?;
        f.read_exact(&mut last)?;
        if last[0] != b'\n' {
            line.push('\n');
        }
    }
    f.seek(SeekFrom::End(0))?;
    line.push_str(image);
    line.push(' ');
    line.push_str(&label_hash(label));
    line.push('\n');
    f.write_all(line.as_bytes())
}

/// The image directories under device directory `device` indexed for image name `label`, each once,
/// in the order they were made; `None` when the device directory has no index (made before kpc kept
/// one, or unreadable). An empty label has no index entries: `Some` of nothing.
pub(crate) fn images_named(v1: &Path, device: &str, label: &str) -> Option<Vec<String>> {
    let f = fs::File::open(v1.join(NAMES_DIR).join(device)).ok()?;
    if label.is_empty() {
        return Some(Vec::new());
    }
    let mut bytes = Vec::new();
    f.take(MAX_INDEX_BYTES).read_to_end(&mut bytes).ok()?;
    let want = label_hash(label);
    let mut seen = HashSet::new();
    Some(
        parse(&bytes)
            .into_iter()
            .filter(|&(img, l)| l == want && seen.insert(img))
            .map(|(img, _)| img.to_owned())
            .collect(),
    )
}

/// Drops the lines of every index whose image directory is gone, and duplicates; removes indexes
/// left empty. The caller holds the eviction lock. Returns how many lines were dropped.
pub(crate) fn compact(v1: &Path) -> u64 {
    let dir = v1.join(NAMES_DIR);
    let Ok(rd) = fs::read_dir(&dir) else {
        return 0;
    };
    let mut dropped = 0;
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(device) = name.to_str() else {
            continue;
        };
        if is_name(device.as_bytes()) {
            dropped += compact_one(v1, device).unwrap_or(0);
        } else if device.ends_with(".tmp") {
            // A compaction killed mid-way; nobody else writes these.
            let _ = fs::remove_file(e.path());
        }
    }
    // Only once every index is gone: rmdir fails otherwise.
    let _ = fs::remove_dir(&dir);
    dropped
}

fn compact_one(v1: &Path, device: &str) -> io::Result<u64> {
    let path = v1.join(NAMES_DIR).join(device);
    let Waited::Acquired { lock, .. } =
        lock::lock_with_timeout(&path, false, LOCK_TIMEOUT, || Ok(()))?
    else {
        return Ok(0);
    };
    let mut bytes = Vec::new();
    let mut f = lock.file();
    f.seek(SeekFrom::Start(0))?;
    f.read_to_end(&mut bytes)?;
    let lines = parse(&bytes);
    let dev_dir = v1.join(device);
    let mut seen = HashSet::new();
    let kept: Vec<(&str, &str)> = lines
        .iter()
        .copied()
        .filter(|&(img, label)| seen.insert((img, label)) && dev_dir.join(img).is_dir())
        .collect();
    if kept.len() * LINE == bytes.len() {
        return Ok(0);
    }
    if kept.is_empty() {
        fs::remove_file(&path)?;
    } else {
        let tmp = v1.join(NAMES_DIR).join(format!("{device}.tmp"));
        let mut out = String::with_capacity(kept.len() * LINE);
        for (img, label) in &kept {
            out.push_str(img);
            out.push(' ');
            out.push_str(label);
            out.push('\n');
        }
        fs::write(&tmp, out)?;
        fs::rename(&tmp, &path)?;
    }
    drop(lock);
    Ok((lines.len() - kept.len()) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_line_costs_only_itself() {
        let a = format!("{} {}\n", "0123456789abcdef", label_hash("a.comp"));
        let b = format!("{} {}\n", "fedcba9876543210", label_hash("b.comp"));
        // A crash after 10 bytes of a line, then the next append ran on.
        let bytes = format!("{a}{}{b}", &a[..10]);
        assert_eq!(
            parse(bytes.as_bytes()),
            [
                ("0123456789abcdef", label_hash("a.comp").as_str()),
                ("fedcba9876543210", label_hash("b.comp").as_str())
            ]
        );
        assert!(parse(b"not an index\n\n").is_empty());
    }
}
