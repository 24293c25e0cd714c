//! What of its targets' status a policy writes (`spec.status`), and the
//! rule that lets several enforcing policies share one kind: no two of
//! them write the same status field or condition type.

use std::collections::BTreeMap;

use crate::util::yaml::Pos;

/// Status fields Runbook itself keeps on every target; no policy declares
/// them.
pub const RUNBOOK_FIELDS: &[&str] = &["decisions", "conditions", "observedGeneration"];

/// The condition Runbook sets when a policy's decision goes wrong.
pub const RUNBOOK_CONDITION: &str = "Degraded";

/// The fields a schedule writes (the time of the run due, the next one).
pub const SCHEDULE_FIELDS: &[&str] = &["lastRunTime", "nextRunTime"];
/// Where named schedules keep their times: `status.schedules.<name>`.
pub const NAMED_SCHEDULE_FIELD: &str = "schedules";

/// One policy's claim on its targets' status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusClaim {
    /// Whether `spec.status` is given; without it the claim is the whole
    /// status.
    pub declared: bool,
    /// Top-level status fields, each with where it is declared.
    pub fields: BTreeMap<String, Option<Pos>>,
    /// Condition types, each with where it is declared.
    pub conditions: BTreeMap<String, Option<Pos>>,
    /// Where the claim is made: `spec.status`, or `spec.target` when the
    /// policy claims everything by not saying.
    pub pos: Option<Pos>,
}

/// Why two claims cannot both hold on one target: what both write, with
/// where each says so.
#[derive(Clone, Debug, PartialEq)]
pub struct Overlap {
    pub what: String,
    pub first: Option<Pos>,
    pub second: Option<Pos>,
}

impl StatusClaim {
    /// The whole status: a policy without `spec.status`.
    pub fn everything(pos: Option<Pos>) -> Self {
        Self {
            pos,
            ..Self::default()
        }
    }

    pub fn allows_field(&self, field: &str) -> bool {
        !self.declared || self.fields.contains_key(field)
    }

    pub fn allows_condition(&self, type_: &str) -> bool {
        !self.declared || self.conditions.contains_key(type_)
    }

    /// What this claim and `other` both write, if anything: everything
    /// when either claims the whole status, else the first shared field or
    /// condition type.
    pub fn overlap(&self, other: &StatusClaim) -> Option<Overlap> {
        if !self.declared || !other.declared {
            let what = match (self.declared, other.declared) {
                (false, false) => "the whole status (neither declares spec.status)",
                (false, true) => "the whole status (the first does not declare spec.status)",
                _ => "the whole status (the second does not declare spec.status)",
            };
            return Some(Overlap {
                what: what.into(),
                first: self.pos,
                second: other.pos,
            });
        }
        let shared = |mine: &BTreeMap<String, Option<Pos>>,
                      theirs: &BTreeMap<String, Option<Pos>>,
                      noun: &str| {
            mine.iter().find_map(|(k, p)| {
                theirs.get(k).map(|q| Overlap {
                    what: format!("{noun} {k:?}"),
                    first: *p,
                    second: *q,
                })
            })
        };
        shared(&self.fields, &other.fields, "status field")
            .or_else(|| shared(&self.conditions, &other.conditions, "condition"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(fields: &[&str], conditions: &[&str]) -> StatusClaim {
        let at = |i: usize| {
            Some(Pos {
                line: 10 + i as u32,
                col: 9,
            })
        };
        StatusClaim {
            declared: true,
            fields: fields
                .iter()
                .enumerate()
                .map(|(i, f)| (f.to_string(), at(i)))
                .collect(),
            conditions: conditions
                .iter()
                .enumerate()
                .map(|(i, c)| (c.to_string(), at(20 + i)))
                .collect(),
            pos: at(0),
        }
    }

    #[test]
    fn disjoint_claims_share_a_target_and_a_shared_name_is_named_with_both_places() {
        let drift = claim(&["phase", "lastScore"], &["Ready", "Progressing"]);
        let retrain = claim(&["collections"], &["TrainingData"]);
        assert_eq!(drift.overlap(&retrain), None);
        let greedy = claim(&["lastScore"], &[]);
        let o = drift.overlap(&greedy).expect("overlap");
        assert_eq!(o.what, "status field \"lastScore\"");
        assert_eq!((o.first.unwrap().line, o.second.unwrap().line), (11, 10));
        let ready = claim(&[], &["Ready"]);
        assert_eq!(drift.overlap(&ready).unwrap().what, "condition \"Ready\"");
    }

    #[test]
    fn not_declaring_claims_everything() {
        let all = StatusClaim::everything(None);
        assert!(all.allows_field("anything") && all.allows_condition("Ready"));
        let o = all.overlap(&claim(&["x"], &[])).expect("overlap");
        assert!(o.what.contains("first does not declare"), "{}", o.what);
        let declared = claim(&["x"], &["Ready"]);
        assert!(declared.allows_field("x") && !declared.allows_field("y"));
        assert!(declared.allows_condition("Ready") && !declared.allows_condition("Done"));
    }
}
