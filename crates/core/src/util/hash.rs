//! Content hashes: policy versions, decision inputs, deterministic names.

use sha2::{Digest, Sha256};

/// Hex SHA-256 of some bytes, shortened to `len` characters.
pub fn short_hex(bytes: &[u8], len: usize) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(len.min(64));
    for c in digest
        .iter()
        .flat_map(|b| [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]])
        .take(len)
    {
        out.push(char::from(c));
    }
    out
}

/// Hash of a JSON value in its canonical (sorted-key) serialisation.
pub fn json_hash(value: &serde_json::Value, len: usize) -> String {
    // serde_json's Map is a BTreeMap here (no preserve_order), so keys are sorted.
    let text = serde_json::to_vec(value).unwrap_or_default();
    short_hex(&text, len)
}

/// FNV-1a as a `Hasher`: stable across releases and platforms, so hashes
/// written into status stay comparable after an upgrade.
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    /// Go on from a state an earlier hash finished with: hashing `a` then
    /// `b` equals hashing `b` after resuming from `a`'s `finish()`.
    pub fn resume(state: u64) -> Self {
        Self(state)
    }
}

impl std::hash::Hasher for Fnv64 {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Feed a JSON value into a hasher without serialising it. Object keys come
/// in sorted order (serde_json's map is ordered), so equal values hash equal.
pub fn hash_value(v: &serde_json::Value, h: &mut impl std::hash::Hasher) {
    use serde_json::Value;
    match v {
        Value::Null => h.write_u8(0),
        Value::Bool(b) => h.write_u8(if *b { 2 } else { 1 }),
        Value::Number(n) => {
            h.write_u8(3);
            match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => h.write_i64(i),
                (None, Some(f)) => h.write_u64(f.to_bits()),
                (None, None) => h.write(n.to_string().as_bytes()),
            }
        }
        Value::String(s) => {
            h.write_u8(4);
            h.write_usize(s.len());
            h.write(s.as_bytes());
        }
        Value::Array(items) => {
            h.write_u8(5);
            h.write_usize(items.len());
            items.iter().for_each(|i| hash_value(i, h));
        }
        Value::Object(map) => {
            h.write_u8(6);
            h.write_usize(map.len());
            for (k, v) in map {
                h.write_usize(k.len());
                h.write(k.as_bytes());
                hash_value(v, h);
            }
        }
    }
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

    #[test]
    fn short_hex_is_the_sha256_digest_cut_to_length() {
        // Names made from it (a run's Job) must not change across releases.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(short_hex(b"abc", 64), abc);
        assert_eq!(short_hex(b"abc", 10), &abc[..10]);
        assert_eq!(short_hex(b"abc", 99), abc);
    }
}
