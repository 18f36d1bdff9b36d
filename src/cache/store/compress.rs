//! zstd for shared entries: a sealed entry ([`seal`](super::seal)) compressed inside its envelope
//! (`auth.rs`, version 3), so the remote and bundles move and keep fewer bytes.
//!
//! The compressed block is `raw length (u64 LE)` then one zstd frame (with its content checksum). The envelope's MAC and signature
//! cover the block (what the reader decompresses), so an authenticating reader decompresses nothing a
//! trusted writer did not write; the sealed entry's own checksums cover what comes out. Decompression
//! is bounded twice: the declared length must be within the reader's limit (`KPC_CACHE_MAX_DEVICE_IMAGE_SIZE`
//! plus the largest key record, see [`entry_limit`]) and the frame must produce exactly that many
//! bytes, so a small hostile value that expands without end (a decompression bomb) costs at most the
//! limit and is refused.

use std::io::Read;

use super::entry::{FileKind, HEADER_LEN, MAX_SRC_LEN, parse_header};

/// Bytes before the zstd frame: the decompressed length.
pub(crate) const LEN_PREFIX: usize = 8;

/// Why a compressed block could not be decompressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Inflate {
    /// The block is damaged: too short, not zstd, or it produces another length than it declares.
    Damaged(&'static str),
    /// It declares (or would produce) more than the reader accepts.
    Oversized {
        /// The length it declares.
        declared: u64,
        /// The reader's limit.
        limit: u64,
    },
}

/// The largest sealed entry a reader whose device images may be `max_image` bytes decompresses: the
/// binary (bounded by the image limit, as what is persisted is) plus the largest key record and the
/// two headers.
pub(crate) fn entry_limit(max_image: u64) -> u64 {
    max_image
        .saturating_add(MAX_SRC_LEN)
        .saturating_add(2 * HEADER_LEN as u64)
}

/// `sealed` compressed at zstd `level` as a block, or `None` when that would not make it smaller (the
/// writer then stores it as it is).
pub(crate) fn compress(sealed: &[u8], level: i32) -> Option<Vec<u8>> {
    // The frame carries zstd's own checksum of its content: damage to the stored bytes is caught by
    // decompression, before the sealed entry's checksums see what came out.
    let mut c = zstd::bulk::Compressor::new(level).ok()?;
    c.include_checksum(true).ok()?;
    let frame = c.compress(sealed).ok()?;
    if frame.len() + LEN_PREFIX >= sealed.len() {
        return None;
    }
    let mut out = Vec::with_capacity(LEN_PREFIX + frame.len());
    out.extend_from_slice(&(sealed.len() as u64).to_le_bytes());
    out.extend_from_slice(&frame);
    Some(out)
}

fn declared(block: &[u8]) -> Result<(u64, &[u8]), Inflate> {
    if block.len() < LEN_PREFIX {
        return Err(Inflate::Damaged("compressed block shorter than its length"));
    }
    let (len, frame) = block.split_at(LEN_PREFIX);
    Ok((u64::from_le_bytes(len.try_into().expect("8 bytes")), frame))
}

/// Decompresses `block`, refusing one that declares more than `limit` bytes or whose frame produces
/// any other number of bytes than it declares. Memory and work are bounded by `limit`.
pub(crate) fn decompress(block: &[u8], limit: u64) -> Result<Vec<u8>, Inflate> {
    let (len, frame) = declared(block)?;
    if len > limit {
        return Err(Inflate::Oversized {
            declared: len,
            limit,
        });
    }
    let damaged = |_| Inflate::Damaged("the zstd frame is damaged");
    let decoder = zstd::stream::read::Decoder::with_buffer(frame).map_err(damaged)?;
    // One byte more than declared tells a frame that would go on (a bomb under a small declared
    // length) from one that ends where it says; the buffer grows only with what really comes out.
    let mut out = Vec::with_capacity(len.min(1 << 20) as usize);
    decoder
        .take(len + 1)
        .read_to_end(&mut out)
        .map_err(damaged)?;
    if out.len() as u64 != len {
        return Err(Inflate::Damaged(
            "the zstd frame does not produce the length it declares",
        ));
    }
    Ok(out)
}

/// The first file of the sealed entry in `block` (its key record: header and payload), decompressing
/// only that far and never more than a key record may hold: what listings read without opening.
pub(crate) fn decompress_record(block: &[u8]) -> Option<Vec<u8>> {
    let (len, frame) = declared(block).ok()?;
    let mut decoder = zstd::stream::read::Decoder::with_buffer(frame).ok()?;
    let mut head = [0u8; HEADER_LEN];
    decoder.read_exact(&mut head).ok()?;
    let src_len = u64::from_le_bytes(head[16..24].try_into().expect("8 bytes"));
    if src_len > MAX_SRC_LEN || src_len + HEADER_LEN as u64 > len {
        return None;
    }
    // Checks magic, version and kind before reading on.
    parse_header(&head, FileKind::Src, src_len + HEADER_LEN as u64).ok()?;
    let mut out = head.to_vec();
    decoder.take(src_len).read_to_end(&mut out).ok()?;
    (out.len() as u64 == src_len + HEADER_LEN as u64).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_only_within_its_limit() {
        let sealed: Vec<u8> = (0..100_000u32).map(|i| (i % 7) as u8).collect();
        let block = compress(&sealed, 3).expect("compressible");
        assert!(block.len() < sealed.len() / 10, "{}", block.len());
        assert_eq!(decompress(&block, 100_000).unwrap(), sealed);
        assert_eq!(
            decompress(&block, 99_999).unwrap_err(),
            Inflate::Oversized {
                declared: 100_000,
                limit: 99_999
            }
        );
        // Incompressible bytes are not worth a block.
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| blake3::hash(&i.to_le_bytes()).as_bytes()[0])
            .collect();
        assert!(compress(&noise, 3).is_none());
    }

    #[test]
    fn a_bomb_under_a_small_declared_length_stops_at_that_length() {
        // 64 MiB of zeros compress to a few KB; declared as 1 KB, the reader stops after 1 KB + 1.
        let frame = zstd::bulk::compress(&vec![0u8; 64 << 20], 19).unwrap();
        assert!(frame.len() < 64 << 10, "{}", frame.len());
        let mut block = 1024u64.to_le_bytes().to_vec();
        block.extend_from_slice(&frame);
        assert!(matches!(
            decompress(&block, 1 << 30),
            Err(Inflate::Damaged(_))
        ));
        // Declared honestly, the limit refuses it before any byte is produced.
        let mut honest = (64u64 << 20).to_le_bytes().to_vec();
        honest.extend_from_slice(&frame);
        assert_eq!(
            decompress(&honest, 1 << 20).unwrap_err(),
            Inflate::Oversized {
                declared: 64 << 20,
                limit: 1 << 20
            }
        );
    }

    #[test]
    fn damaged_blocks_are_refused() {
        let sealed = vec![5u8; 10_000];
        let block = compress(&sealed, 3).unwrap();
        assert!(decompress(&block[..4], 1 << 20).is_err());
        assert!(decompress(&block[..block.len() - 3], 1 << 20).is_err());
        // A flipped bit either breaks the frame or changes what comes out (the sealed entry's own
        // checksums then refuse it); it never yields the original.
        let mut flipped = block.clone();
        flipped[LEN_PREFIX + 4] ^= 0xff;
        assert_ne!(decompress(&flipped, 1 << 20), Ok(sealed.clone()));
        let mut longer = block.clone();
        longer[0] += 1;
        assert!(decompress(&longer, 1 << 20).is_err());
    }
}
