//! Content hashes: policy versions, decision inputs, deterministic names.

use sha2::{Digest, Sha256};

/// Hex SHA-256 of some bytes, shortened to `len` characters.
pub fn short_hex(bytes: &[u8], len: usize) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out.truncate(len);
    out
}

/// Hash of a JSON value in its canonical (sorted-key) serialisation.
pub fn json_hash(value: &serde_json::Value, len: usize) -> String {
    // serde_json's Map is a BTreeMap here (no preserve_order), so keys are sorted.
    let text = serde_json::to_vec(value).unwrap_or_default();
    short_hex(&text, len)
}

/// A 64-bit FNV-1a hash, for cheap non-cryptographic uses (jitter, shards).
pub fn fnv64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_hash_ignores_key_order() {
        let a: serde_json::Value = serde_json::from_str(r#"{"a":1,"b":[1,2]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"b":[1,2],"a":1}"#).unwrap();
        assert_eq!(json_hash(&a, 16), json_hash(&b, 16));
        let c: serde_json::Value = serde_json::from_str(r#"{"b":[2,1],"a":1}"#).unwrap();
        assert_ne!(json_hash(&a, 16), json_hash(&c, 16));
    }
}
