//! A small append-only record file shared by every process of one cache directory, kept bounded:
//! the eviction record (`evicted.rs`) and the miss journal (`crate::cache::journal`).
//!
//! - **Lines.** Each record is one line, `<payload>\t#<checksum>\n`, the checksum being 8 hex
//!   characters of BLAKE3 over the payload. A reader keeps only lines whose checksum matches, so a
//!   torn last line (a process killed, or a power cut, mid-write) or any damage is skipped, never
//!   misread; a line appended after a torn one starts a line of its own only after the next newline,
//!   so at most the torn record and the one glued to it are lost.
//! - **Writers** take an exclusive `flock` on the file itself (`lock.rs`, which reopens it when it was
//!   replaced meanwhile), write their lines in one `write` at its end, and let go: no two writers
//!   interleave, whatever the number of processes. Nothing is fsynced: a record is a hint, and losing
//!   the last ones to a power cut costs an explanation, never an entry.
//! - **Bounded.** Once the file holds more than twice `keep` records' worth of bytes, the writer that
//!   notices keeps the last `keep` valid lines: it writes them to a temporary file and renames it over
//!   the record, under the lock, so readers (who take no lock) see the old file or the new one.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::lock;

/// A bounded record file (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct BoundedLog {
    path: PathBuf,
    keep: usize,
    /// Bytes past which the file is compacted: twice `keep` lines of a typical length.
    compact_at: u64,
}

fn checksum(payload: &str) -> String {
    blake3::hash(payload.as_bytes()).to_hex()[..8].to_owned()
}

/// The payload of `line` if its checksum matches.
fn valid(line: &str) -> Option<&str> {
    let (payload, sum) = line.rsplit_once("\t#")?;
    (sum.len() == 8 && checksum(payload) == sum && !payload.contains('\n')).then_some(payload)
}

impl BoundedLog {
    /// The record at `path`, keeping about the last `keep` records of `line_len` bytes each.
    pub(crate) fn new(path: PathBuf, keep: usize, line_len: u64) -> BoundedLog {
        BoundedLog {
            path,
            keep,
            compact_at: 2 * keep as u64 * line_len.max(16),
        }
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `payloads` (no newline in any: such a payload is dropped) as one write, creating the
    /// file (and its directory) when needed, and compacts when the file grew past its bound.
    pub(crate) fn append(&self, payloads: &[String]) -> io::Result<()> {
        let mut buf = String::new();
        for p in payloads.iter().filter(|p| !p.contains('\n')) {
            buf.push_str(p);
            buf.push_str("\t#");
            buf.push_str(&checksum(p));
            buf.push('\n');
        }
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)?;
        }
        let held = lock::lock_blocking(&self.path)?;
        let mut f = held.file();
        let end = f.seek(SeekFrom::End(0))?;
        // A torn line left by a killed writer is ended first, so this record starts a line.
        let mut torn = false;
        if end > 0 {
            let mut last = [0u8; 1];
            f.seek(SeekFrom::Start(end - 1))?;
            f.read_exact(&mut last)?;
            torn = last[0] != b'\n';
        }
        if torn {
            buf.insert(0, '\n');
        }
        f.seek(SeekFrom::End(0))?;
        f.write_all(buf.as_bytes())?;
        if end + buf.len() as u64 > self.compact_at {
            self.compact(f)?;
        }
        Ok(())
    }

    /// Keeps the last `keep` valid lines (the caller holds the lock on `f`).
    fn compact(&self, mut f: &File) -> io::Result<()> {
        let mut text = String::new();
        f.seek(SeekFrom::Start(0))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        text.push_str(&String::from_utf8_lossy(&bytes));
        let lines: Vec<&str> = text.lines().filter(|l| valid(l).is_some()).collect();
        let start = lines.len().saturating_sub(self.keep);
        let mut out = String::new();
        for l in &lines[start..] {
            out.push_str(l);
            out.push('\n');
        }
        let tmp = self
            .path
            .with_extension(format!("tmp.{}", std::process::id()));
        fs::write(&tmp, out.as_bytes())?;
        fs::rename(&tmp, &self.path).inspect_err(|_| {
            let _ = fs::remove_file(&tmp);
        })
    }

    /// Every valid record's payload, oldest first; none when the file does not exist.
    pub(crate) fn read(&self) -> io::Result<Vec<String>> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(valid)
            .map(str::to_owned)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_and_damaged_lines_are_skipped_and_the_file_stays_bounded() {
        let dir = std::env::temp_dir().join(format!("kpc-boundlog-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let log = BoundedLog::new(dir.join("x.log"), 10, 20);
        log.append(&["a 1".into(), "b 2".into()]).unwrap();
        // A torn record (no checksum, no newline), then a good one.
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(log.path())
            .unwrap();
        f.write_all(b"c 3\t#12").unwrap();
        log.append(&["d 4".into()]).unwrap();
        assert_eq!(log.read().unwrap(), ["a 1", "b 2", "d 4"]);
        for i in 0..100 {
            log.append(&[format!("record {i}")]).unwrap();
        }
        let kept = log.read().unwrap();
        assert!(kept.len() <= 20, "{}", kept.len());
        assert_eq!(kept.last().map(String::as_str), Some("record 99"));
        assert!(fs::metadata(log.path()).unwrap().len() <= 2 * 10 * 20 + 40);
        let _ = fs::remove_dir_all(&dir);
    }
}
