use super::*;
use crate::cache::Digest;

fn key(i: u8) -> StoreKey {
    StoreKey::new(
        "backend=fake\n",
        Digest::of(b"dev"),
        Digest::of(&[i]),
        100,
        &[i, 1],
        "-O2",
    )
}

#[test]
fn sealed_entries_open_only_under_their_key_and_intact() {
    let bin = b"a binary".to_vec();
    let s = seal(&key(1), &bin, Duration::from_millis(7));
    let hit = StoreHit::unseal(&key(1), &s).unwrap();
    assert_eq!(hit.bytes(), &bin[..]);
    assert_eq!(hit.build_time(), Duration::from_millis(7));
    assert_eq!(sealed_record(&s).unwrap().options, "-O2");
    assert_eq!(
        StoreHit::unseal(&key(2), &s).unwrap_err(),
        Defect::KeyMismatch
    );
    for i in 0..s.len() {
        let mut bad = s.clone();
        bad[i] ^= 0x10;
        assert!(StoreHit::unseal(&key(1), &bad).is_err(), "byte {i}");
    }
    for n in 0..s.len() {
        assert!(StoreHit::unseal(&key(1), &s[..n]).is_err(), "length {n}");
    }
    let mut long = s.clone();
    long.push(0);
    assert_eq!(
        StoreHit::unseal(&key(1), &long).unwrap_err(),
        Defect::TrailingBytes
    );
    // A binary sealed under another key, spliced behind this key's record.
    let other = seal(&key(2), &bin, Duration::ZERO);
    let (src1, _) = split_sealed(&s).unwrap();
    let (_, bin2) = split_sealed(&other).unwrap();
    let spliced = [src1, bin2].concat();
    assert_eq!(
        StoreHit::unseal(&key(1), &spliced).unwrap_err(),
        Defect::KeyMismatch
    );
}
