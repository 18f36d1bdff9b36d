//! The bytes kpc persists for a program on a device that loads VK_KHR_pipeline_binary binaries.
//!
//! Per pipeline, it is, the list of (key, data)
//! pairs `vkGetPipelineBinaryDataKHR` returned:
//!
//! ```text
//! u32 pipelines | per pipeline: u32 binaries | per binary: u32 key bytes (1..=32) | key |
//! u64 data bytes (> 0) | data
//! ```
//!
//! All integers little endian; every length is checked before anything is copied.

use super::MAX_KEY_SIZE;

/// One pipeline binary as the driver gave it: its key and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BinaryData {
    /// The binary's key (1 to 32 bytes).
    pub key: Vec<u8>,
    /// The driver's data for it.
    pub data: Vec<u8>,
}

impl BinaryData {
    /// The binary of `key` (1 to 32 bytes) with the driver's `data`.
    pub fn new(key: Vec<u8>, data: Vec<u8>) -> Self {
        BinaryData { key, data }
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The payload bytes for `pipelines` (per pipeline, its binaries).
pub fn encode(pipelines: &[Vec<BinaryData>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(pipelines.len() as u32).to_le_bytes());
    for p in pipelines {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        for b in p {
            out.extend_from_slice(&(b.key.len() as u32).to_le_bytes());
            out.extend_from_slice(&b.key);
            out.extend_from_slice(&(b.data.len() as u64).to_le_bytes());
            out.extend_from_slice(&b.data);
        }
    }
    out
}

/// Parses a payload written by [`encode`], checking every length before anything is copied.
///
/// Errors: what is wrong, in words (a count or length past the end, a key of 0 or more than 32
/// bytes, empty data, a pipeline without binaries, bytes left over).
pub fn decode(bytes: &[u8]) -> std::result::Result<Vec<Vec<BinaryData>>, String> {
    let short = |what: &str| format!("pipeline binaries truncated in {what}");
    let pipelines = u32_at(bytes, 0).ok_or_else(|| short("the pipeline count"))?;
    let mut at = 4usize;
    // Each pipeline takes at least 4 bytes, so a count larger than that is forged; checked before
    // anything is allocated for it.
    if pipelines as usize > bytes.len() / 4 {
        return Err(format!("{pipelines} pipelines in {} bytes", bytes.len()));
    }
    let mut out = Vec::with_capacity(pipelines as usize);
    for p in 0..pipelines {
        let n = u32_at(bytes, at).ok_or_else(|| short("a binary count"))?;
        at += 4;
        if n == 0 {
            return Err(format!("pipeline {p} has no binaries"));
        }
        if n as usize > (bytes.len() - at) / 13 {
            return Err(format!("pipeline {p}: {n} binaries cannot fit"));
        }
        let mut binaries = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let k = u32_at(bytes, at).ok_or_else(|| short("a key length"))? as usize;
            at += 4;
            if k == 0 || k > MAX_KEY_SIZE {
                return Err(format!(
                    "pipeline {p}: key of {k} bytes (1 to {MAX_KEY_SIZE})"
                ));
            }
            let key = bytes
                .get(at..at + k)
                .ok_or_else(|| short("a key"))?
                .to_vec();
            at += k;
            let d = u64_at(bytes, at).ok_or_else(|| short("a data length"))?;
            at += 8;
            let end = usize::try_from(d)
                .ok()
                .and_then(|d| at.checked_add(d))
                .filter(|&e| e <= bytes.len() && d > 0)
                .ok_or_else(|| {
                    format!(
                        "pipeline {p}: binary data of {d} bytes, {} remain",
                        bytes.len() - at
                    )
                })?;
            binaries.push(BinaryData {
                key,
                data: bytes[at..end].to_vec(),
            });
            at = end;
        }
        out.push(binaries);
    }
    if at != bytes.len() {
        return Err(format!(
            "{} bytes after the last pipeline binary",
            bytes.len() - at
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Vec<BinaryData>> {
        vec![
            vec![BinaryData {
                key: vec![1; 32],
                data: vec![7; 100],
            }],
            vec![
                BinaryData {
                    key: vec![2; 20],
                    data: vec![8; 3],
                },
                BinaryData {
                    key: vec![3],
                    data: vec![9],
                },
            ],
        ]
    }

    #[test]
    fn payload_round_trips() {
        let s = sample();
        assert_eq!(decode(&encode(&s)).unwrap(), s);
    }

    #[test]
    fn every_damaged_payload_is_refused_with_a_reason() {
        let good = encode(&sample());
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "truncated at {cut}");
        }
        let mut extra = good.clone();
        extra.push(0);
        assert!(decode(&extra).unwrap_err().contains("after the last"));
        let mut big_count = good.clone();
        big_count[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&big_count).unwrap_err().contains("pipelines in"));
        let mut long_key = good.clone();
        long_key[8..12].copy_from_slice(&33u32.to_le_bytes());
        assert!(decode(&long_key).unwrap_err().contains("key of 33 bytes"));
        let mut huge_data = good.clone();
        huge_data[44..52].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge_data).unwrap_err().contains("binary data of"));
        let no_binaries = [1u8, 0, 0, 0, 0, 0, 0, 0];
        assert!(decode(&no_binaries).unwrap_err().contains("no binaries"));
    }
}
