//! Which replica decides for which target, when several share the work
//! (`runbook run --shards`): a consistent-hash ring over the live
//! members. Each member stands at many points of the ring; a target
//! belongs to the member at the first point at or after its key's hash.
//! A member joining or leaving moves only the targets between its points
//! and the ones before them (about 1/N of all), and every replica that
//! sees the same members computes the same owner for every target.

use crate::util::hash::fnv64;

/// The label naming the member a target (and its children) belongs to.
pub const SHARD_LABEL: &str = "runbook.dev/shard";

/// The label asking a target's member to let it go (the handshake of a
/// move): the member stops deciding for it, then removes both labels.
pub const DRAIN_LABEL: &str = "runbook.dev/drain";

/// The annotation the authorship webhook puts beside the shard label it
/// gives a target at its creation (from the ring the assigner
/// published), naming the same member. It stays only while the target
/// keeps that label: the webhook drops it from any other write that
/// changes the label or brings it, and every move takes it off. While a
/// target carries it, no replica but that member has decided for it
/// since it was created, so any Runbook state of it carries that
/// member's label too, and that member's cache tells whether one exists.
pub const PLACED_ANNOTATION: &str = "runbook.dev/placed";

/// Whether an object was placed on `member` at its creation and has been
/// there since (see [`PLACED_ANNOTATION`]).
pub fn placed_since_creation(object: &serde_json::Value, member: &str) -> bool {
    let meta = |field: &str, key: &str| {
        object
            .pointer(&format!("/metadata/{field}"))
            .and_then(|m| m.get(key))
            .and_then(serde_json::Value::as_str)
    };
    meta("labels", SHARD_LABEL) == Some(member)
        && meta("annotations", PLACED_ANNOTATION) == Some(member)
}

/// Points of the ring per member: each member's share stays within about
/// a tenth of 1/N at 2 to 8 members (over 20,000 keys and 80 sets of
/// member names, the largest share was 1.11 times 1/N with 512 points,
/// 1.27 with 128).
const POINTS: usize = 512;

/// A 64-bit hash spread over the whole range (FNV-1a, then a finalizer
/// that mixes its high bits into its low ones, as short keys need).
fn spread(bytes: &[u8]) -> u64 {
    let mut x = fnv64(bytes);
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The key a target is placed by: its group, kind, namespace and name
/// (its uid is not known at admission, and a name is enough to place it).
pub fn key(group: &str, kind: &str, namespace: &str, name: &str) -> String {
    format!("{group}/{kind}/{namespace}/{name}")
}

/// The ring over a set of members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ring {
    /// (point, member index), sorted by point.
    points: Vec<(u64, usize)>,
    members: Vec<String>,
}

impl Ring {
    /// The ring of these members (order and repeats do not matter).
    pub fn new<S: AsRef<str>>(members: impl IntoIterator<Item = S>) -> Self {
        let mut members: Vec<String> = members
            .into_iter()
            .map(|m| m.as_ref().to_string())
            .collect();
        members.sort();
        members.dedup();
        let mut points = Vec::with_capacity(members.len() * POINTS);
        for (i, m) in members.iter().enumerate() {
            for p in 0..POINTS {
                points.push((spread(format!("{m}#{p}").as_bytes()), i));
            }
        }
        points.sort_unstable();
        Self { points, members }
    }

    pub fn members(&self) -> &[String] {
        &self.members
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member a key belongs to; `None` on an empty ring.
    pub fn owner(&self, key: &str) -> Option<&str> {
        if self.points.is_empty() {
            return None;
        }
        let h = spread(key.as_bytes());
        let at = self.points.partition_point(|(p, _)| *p < h);
        let (_, member) = self.points[at % self.points.len()];
        Some(&self.members[member])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn keys(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                key(
                    "example.com",
                    "Widget",
                    &format!("ns-{}", i % 7),
                    &format!("w-{i}"),
                )
            })
            .collect()
    }

    fn shares(ring: &Ring, keys: &[String]) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for k in keys {
            *out.entry(ring.owner(k).unwrap().to_string()).or_insert(0) += 1;
        }
        out
    }

    #[test]
    fn every_member_gets_about_its_share() {
        let keys = keys(20_000);
        for n in [2usize, 3, 4, 8] {
            let members: Vec<String> = (0..n).map(|i| format!("runbook-{i}")).collect();
            let ring = Ring::new(&members);
            let got = shares(&ring, &keys);
            assert_eq!(got.len(), n);
            let fair = keys.len() as f64 / n as f64;
            for (m, c) in &got {
                let off = (*c as f64 - fair).abs() / fair;
                assert!(off < 0.12, "{n} members: {m} has {c}, fair {fair}");
            }
        }
    }

    #[test]
    fn a_member_joining_or_leaving_moves_only_its_share() {
        let keys = keys(20_000);
        let three = Ring::new(["a", "b", "c"]);
        let four = Ring::new(["c", "a", "d", "b"]);
        let moved: Vec<&String> = keys
            .iter()
            .filter(|k| three.owner(k) != four.owner(k))
            .collect();
        // Only to the new member, and about a quarter of all.
        assert!(moved.iter().all(|k| four.owner(k) == Some("d")));
        let share = moved.len() as f64 / keys.len() as f64;
        assert!((0.15..0.35).contains(&share), "{share}");
        // The order members are given in does not matter.
        assert_eq!(four, Ring::new(["a", "b", "c", "d", "a"]));
    }

    #[test]
    fn an_empty_ring_places_nothing() {
        assert_eq!(Ring::new(Vec::<String>::new()).owner("x"), None);
        assert_eq!(Ring::new(["only"]).owner("x"), Some("only"));
    }
}
