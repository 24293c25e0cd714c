//! Taking over a gone member's targets, and deciding unplaced ones,
//! without a write per target.
//!
//! When a sharded replica stops renewing its member Lease, its targets
//! still carry its label. Labelling each for its new place is a write per
//! target, and at tens of thousands of targets those writes take far
//! longer than the lease duration. So the survivors decide for them first
//! and the labels follow:
//!
//! - The assigner publishes the ring it places by (`members::Published`):
//!   its members, and the members gone from it whose targets are not all
//!   labelled elsewhere yet. A member is moved from the one to the other
//!   once every replica counts it gone, which is after it stopped acting
//!   on its own account (see `members`).
//! - Every replica watches its own label and, beside it, the gone
//!   members' labels (`shares`), and decides for a target labelled for a gone member when the
//!   published ring places it on this replica. All replicas read the same
//!   published ring, so exactly one decides for each such target.
//! - The assigner adds members to the ring only while no member is gone:
//!   a joining member therefore never takes a target another is deciding
//!   for as the gone member's.
//!
//! Targets without a label (there before the replicas started, or made
//! while no replica answered the authorship webhook) are decided the same
//! way, before the assigner labels them: while the published ring is
//! open (`Published::open`: no member gone, none waiting to join), each
//! member watches the targets labelled for no member beside its own and
//! decides for those the ring places on it. Before a member joins a ring
//! with members, the assigner publishes it closed and waits a lease
//! duration (`next_ring`), so no replica's recent look still places an
//! unplaced target by the old ring.
//!
//! `gate` holds the rules a reconcile applies; `Known` is what this
//! replica knows, a plain state its looks at the members step, and
//! `Placement` shares it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::members::{Published, View};
use super::shares::Unheld;
use runbook_core::shard::Ring;
use runbook_core::util::lock;

/// Whether a reconcile may decide for a target, sharded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// This replica decides for it.
    Decide,
    /// Another replica does (or none until it is placed): wait for a
    /// change of the target, such as a new label.
    NotMine,
    /// It may be this replica's once its view of the members is newer:
    /// look again shortly.
    NotYet,
}

/// What this replica knows of the ring, kept from its looks at the
/// members (`assign::run`): a plain state, changed by the steps below
/// with the time passed in, and tested without a cluster.
#[derive(Default)]
pub struct Known {
    seen: Option<Seen>,
    /// When this replica last began leading its own share.
    gained: Option<Instant>,
    /// The gone members whose labels this replica's watches include.
    watched: BTreeSet<String>,
    /// How many targets each of the assigner's looks (by kind and
    /// selection) found the last time (`assign`).
    looked: HashMap<String, usize>,
}

struct Seen {
    view: View,
    published: Published,
    /// The published ring, built once per change.
    ring: Ring,
}

/// What a new look at the members asks of the replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed {
    /// Nothing more to watch.
    Same,
    /// The watches must include more gone members' labels: the caches
    /// are listed again with them.
    Reselect,
}

impl Known {
    /// Keep a new look at the members.
    pub fn observe(&mut self, view: View) -> Observed {
        let published = view.published.clone().unwrap_or_default();
        let ring = match self.seen.take() {
            Some(s) if s.published.members == published.members => s.ring,
            _ => published.ring(),
        };
        let grew = !published.gone.is_subset(&self.watched);
        if grew {
            // The ones no longer gone are dropped at the same time: their
            // targets are all labelled elsewhere.
            self.watched = published.gone.clone();
        }
        self.seen = Some(Seen {
            view,
            published,
            ring,
        });
        match grew {
            true => Observed::Reselect,
            false => Observed::Same,
        }
    }

    /// This replica began leading its own share (its member Lease) `at`.
    pub fn gained(&mut self, at: Instant) {
        self.gained = Some(at);
    }

    /// Whether the assigner's look `look` is asked of the API server's
    /// watch cache: where it found at most `page` targets the last time.
    /// The cache answers whole, and cheaply where it finds none (storage
    /// reads every target to find none); a look that found many, or
    /// never looked, is asked of storage a page at a time, so that the
    /// assigner holds thousands of targets at once at most once (many
    /// created between two looks), not look after look.
    pub fn cache_serves(&self, look: &str, page: usize) -> bool {
        self.looked.get(look).is_some_and(|n| *n <= page)
    }

    /// What the assigner's look `look` found.
    pub fn looked(&mut self, look: &str, found: usize) {
        self.looked.insert(look.to_string(), found);
    }

    /// Whether the published ring places a target whose ring key `key`
    /// gives on this replica (`me`): a gone member's target that another
    /// replica decides for need not be held here. True while no ring is
    /// known (the reconcile's `gate` decides then).
    pub fn places_here(&self, me: &str, key: impl FnOnce() -> String) -> bool {
        match self.seen.as_ref() {
            Some(s) if !s.ring.is_empty() => s.ring.owner(&key()) == Some(me),
            _ => true,
        }
    }

    /// The published ring's members, where it decides for unplaced
    /// targets and `me` is among them.
    pub fn unplaced_ring(&self, me: &str) -> Option<BTreeSet<String>> {
        let p = &self.seen.as_ref()?.published;
        (p.open && p.members.contains(me)).then(|| p.members.clone())
    }

    /// The member the published ring places a key on; `None` before
    /// a ring with members is known.
    pub fn owner(&self, key: &str) -> Option<String> {
        self.seen.as_ref()?.ring.owner(key).map(str::to_string)
    }

    /// `gate` with what this replica knows at `now`.
    pub fn gate(&self, ask: Ask<'_>, now: Instant, key: impl FnOnce() -> String) -> Gate {
        let Some(s) = self.seen.as_ref() else {
            return Gate::NotYet;
        };
        gate(
            &Knowledge {
                me: ask.me,
                view: &s.view,
                published: &s.published,
                ring: &s.ring,
                gained: self.gained,
                fresh: ask.fresh,
            },
            now,
            ask.label,
            key,
        )
    }
}

/// What a reconcile asks the gate of a target.
#[derive(Clone, Copy)]
pub struct Ask<'a> {
    /// This replica.
    pub me: &'a str,
    /// The target's shard label.
    pub label: Option<&'a str>,
    /// How old a look may be to decide for a gone member's target.
    pub fresh: Duration,
}

/// What this replica knows of the ring, shared by its reconciles, its
/// watches and the assigner's loop: [`Known`] behind one lock, and the
/// signals its steps give.
#[derive(Default)]
pub struct Placement {
    known: Mutex<Known>,
    /// Told when the watches must include more gone members' labels: the
    /// caches are listed again with them.
    pub reselect: Notify,
    /// What the target controllers watch beside their own share
    /// (`shares`): the gone members `watched`, once the caches hold
    /// their children, and the ring while it decides for unplaced
    /// targets.
    pub unheld: tokio::sync::watch::Sender<Unheld>,
}

impl Placement {
    /// Keep a new look at the members, for replica `me`. Returns whether
    /// the watches must now include more gone members' labels
    /// (`reselect` is told too). The watch of unplaced targets follows
    /// the published ring at once: their children carry this replica's
    /// label, which its caches hold already.
    pub fn observe(&self, me: &str, view: View) -> bool {
        let (step, ring) = {
            let mut known = lock(&self.known);
            let step = known.observe(view);
            (step, known.unplaced_ring(me))
        };
        self.unheld.send_if_modified(|u| {
            let changed = u.ring != ring;
            u.ring = ring;
            changed
        });
        if step == Observed::Reselect {
            self.reselect.notify_one();
        }
        step == Observed::Reselect
    }

    /// See [`Known::cache_serves`].
    pub fn cache_serves(&self, look: &str, page: usize) -> bool {
        lock(&self.known).cache_serves(look, page)
    }

    /// What the assigner's look `look` found.
    pub fn looked(&self, look: &str, found: usize) {
        lock(&self.known).looked(look, found);
    }

    /// This replica began leading its own share (its member Lease).
    pub fn gained(&self) {
        lock(&self.known).gained(Instant::now());
    }

    /// The gone members whose labels the watches include.
    pub fn watched(&self) -> BTreeSet<String> {
        lock(&self.known).watched.clone()
    }

    /// See [`Known::places_here`].
    pub fn places_here(&self, me: &str, key: impl FnOnce() -> String) -> bool {
        lock(&self.known).places_here(me, key)
    }

    /// See [`Known::owner`].
    pub fn owner(&self, key: &str) -> Option<String> {
        lock(&self.known).owner(key)
    }

    /// `gate` with what this replica knows now.
    pub fn gate(&self, ask: Ask<'_>, key: impl FnOnce() -> String) -> Gate {
        lock(&self.known).gate(ask, Instant::now(), key)
    }
}

/// What a reconcile's gate looks at.
pub struct Knowledge<'a> {
    pub me: &'a str,
    pub view: &'a View,
    pub published: &'a Published,
    pub ring: &'a Ring,
    /// When this replica last began leading its own share.
    pub gained: Option<Instant>,
    /// How old a look may be for this replica to decide for a gone
    /// member's target on its account.
    pub fresh: Duration,
}

/// Whether this replica decides for a target labelled `label` whose ring
/// key `key` gives (built only for a target not labelled for it):
///
/// - Its own label: yes, unless the published ring counts it gone (a
///   replica that came back under the same identity: its targets are
///   being placed elsewhere), judged from a look after it began leading.
/// - A gone member's label: yes where the published ring places the
///   target on this replica, the member's Lease is not live by this
///   replica's own clock, and the look is recent (`fresh`: a lease
///   duration; the assigner lets no member join until that long after
///   the last gone member's targets are placed, so a look that counts a
///   member gone is never used once it is back).
/// - No label: yes where the published ring decides for unplaced
///   targets, places it on this replica, and the look is recent (the
///   assigner stops the ring deciding for them a lease duration before
///   a member joins, so two replicas never place one by two rings).
/// - Anything else: no.
pub fn gate(
    k: &Knowledge<'_>,
    now: Instant,
    label: Option<&str>,
    key: impl FnOnce() -> String,
) -> Gate {
    // A look from before this replica began leading may predate its
    // being counted gone.
    if k.gained.is_some_and(|g| k.view.at < g) {
        return Gate::NotYet;
    }
    let by_ring = || match k.ring.owner(&key()) == Some(k.me) {
        true => Gate::Decide,
        false => Gate::NotMine,
    };
    let stale = now.duration_since(k.view.at) > k.fresh;
    let Some(label) = label else {
        if !k.published.open || !k.published.members.contains(k.me) {
            return Gate::NotMine;
        }
        return match stale {
            true => Gate::NotYet,
            false => by_ring(),
        };
    };
    if label == k.me {
        return match k.published.gone.contains(k.me) {
            true => Gate::NotMine,
            false => Gate::Decide,
        };
    }
    if !k.published.gone.contains(label) || !k.published.members.contains(k.me) {
        return Gate::NotMine;
    }
    // Counted gone by the assigner, but not yet by this replica, or this
    // look is too old to act on: soon, perhaps.
    if k.view.live.contains(label) || stale {
        return Gate::NotYet;
    }
    by_ring()
}

/// When live members not in the ring may join it.
#[derive(Clone, Copy, Debug)]
pub struct Joining {
    /// Those starting together have all been seen.
    pub settled: bool,
    /// No member has been gone for a while.
    pub quiet: bool,
    /// The published ring has not decided for unplaced targets for a
    /// lease duration: no replica's recent look says it does.
    pub closed: bool,
}

/// The ring the assigner publishes next, from the one published and the
/// members live now: members no longer live are moved to the gone;
/// `cleared` are gone members none of whose targets carries their label
/// any more. The live ones not in the ring join it once `settled` (those
/// starting together have all been seen), and only when no member has
/// been gone for a while (`quiet`), or the ring is empty (nobody decides
/// for a gone member's targets then).
///
/// The ring decides for unplaced targets (`open`) while no member is
/// gone and none waits to join. A member joining a ring that has members
/// waits until the ring has not decided for them for a lease duration
/// (`closed`): the ring is published closed first, so that no replica
/// still places an unplaced target by the old ring once the new one
/// places it elsewhere.
pub fn next_ring(
    published: &Published,
    live: &BTreeSet<String>,
    cleared: &BTreeSet<String>,
    joining: Joining,
) -> Published {
    let Joining {
        settled,
        quiet,
        closed,
    } = joining;
    let members: BTreeSet<String> = published.members.intersection(live).cloned().collect();
    let gone: BTreeSet<String> = published
        .gone
        .iter()
        .chain(published.members.difference(live))
        .filter(|g| !cleared.contains(*g))
        .cloned()
        .collect();
    let join = settled && (members.is_empty() || (gone.is_empty() && quiet));
    // A live member waits to join a ring with members: the ring stays
    // closed until it has joined.
    let waiting = settled && !members.is_empty() && !live.is_subset(&members);
    let (members, open) = match join && (!waiting || closed) {
        true => (live.clone(), gone.is_empty()),
        false => (members, gone.is_empty() && !waiting),
    };
    Published {
        open: open && !members.is_empty(),
        members,
        gone,
        version: published.version.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runbook_core::shard::key;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn published(members: &[&str], gone: &[&str]) -> Published {
        Published {
            members: set(members),
            gone: set(gone),
            open: gone.is_empty() && !members.is_empty(),
            version: Some("1".into()),
        }
    }

    struct World {
        view: View,
        published: Published,
        ring: Ring,
    }

    fn world(live: &[&str], members: &[&str], gone: &[&str], at: Instant) -> World {
        let published = published(members, gone);
        World {
            view: View {
                live: set(live),
                published: Some(published.clone()),
                at,
            },
            ring: published.ring(),
            published,
        }
    }

    fn decide(w: &World, me: &str, label: Option<&str>, k: &str, now: Instant) -> Gate {
        let knowledge = Knowledge {
            me,
            view: &w.view,
            published: &w.published,
            ring: &w.ring,
            gained: None,
            fresh: Duration::from_secs(10),
        };
        gate(&knowledge, now, label, || k.to_string())
    }

    /// Every survivor decides with the same published ring: each of the
    /// gone member's targets is decided by exactly one of them.
    /// The assigner asks the watch cache only for a look that found at
    /// most a page the last time: never for the first look (at start-up,
    /// all targets are unplaced), nor after one that found many.
    #[test]
    fn the_watch_cache_serves_looks_that_found_few() {
        let mut p = Known::default();
        assert!(!p.cache_serves("Widget !shard", 500));
        p.looked("Widget !shard", 20_000);
        assert!(!p.cache_serves("Widget !shard", 500));
        p.looked("Widget !shard", 0);
        assert!(p.cache_serves("Widget !shard", 500));
        assert!(!p.cache_serves("Gadget !shard", 500));
        p.looked("Widget !shard", 500);
        assert!(p.cache_serves("Widget !shard", 500));
    }

    /// The watches widen when a member is newly gone, and not when one
    /// stops being gone (its targets are all labelled elsewhere): they
    /// narrow with the next widening, never listing again for less.
    #[test]
    fn a_look_reselects_the_watches_only_when_more_members_are_gone() {
        let now = Instant::now();
        let mut k = Known::default();
        let look = |members: &[&str], gone: &[&str]| world(members, members, gone, now).view;
        assert_eq!(k.observe(look(&["a", "b"], &[])), Observed::Same);
        assert_eq!(k.observe(look(&["a"], &["b"])), Observed::Reselect);
        assert_eq!(k.watched, set(&["b"]));
        assert_eq!(k.observe(look(&["a"], &["b"])), Observed::Same);
        assert_eq!(k.observe(look(&["a"], &[])), Observed::Same);
        assert_eq!(k.watched, set(&["b"]), "kept until the next widening");
        assert_eq!(k.observe(look(&["x"], &["a"])), Observed::Reselect);
        assert_eq!(k.watched, set(&["a"]));
    }

    /// Before any look, nothing is decided (a look may be on its way); a
    /// target is held wherever no ring is known; and a look from before
    /// this replica began leading decides nothing.
    #[test]
    fn what_a_replica_may_do_before_and_after_its_first_look() {
        let now = Instant::now();
        let mut k = Known::default();
        let ask = |label| Ask {
            me: "a",
            label,
            fresh: Duration::from_secs(10),
        };
        let t = || key("", "ConfigMap", "shop", "t1");
        assert_eq!(k.gate(ask(Some("a")), now, t), Gate::NotYet);
        assert!(k.places_here("a", t) && k.places_here("b", t));
        k.observe(world(&["a", "b"], &["a", "b"], &[], now).view);
        assert_eq!(k.gate(ask(Some("a")), now, t), Gate::Decide);
        assert_ne!(k.places_here("a", t), k.places_here("b", t));
        k.gained(now + Duration::from_millis(1));
        assert_eq!(k.gate(ask(Some("a")), now, t), Gate::NotYet);
        let later = now + Duration::from_secs(1);
        k.observe(world(&["a", "b"], &["a", "b"], &[], later).view);
        assert_eq!(k.gate(ask(Some("a")), later, t), Gate::Decide);
    }

    #[test]
    fn a_gone_members_targets_are_decided_by_exactly_one_survivor() {
        let now = Instant::now();
        let w = world(&["a", "b", "c"], &["a", "b", "c"], &["d"], now);
        for i in 0..200 {
            let k = key("example.com", "Widget", "shop", &format!("w{i}"));
            let deciding: Vec<&str> = ["a", "b", "c"]
                .into_iter()
                .filter(|me| decide(&w, me, Some("d"), &k, now) == Gate::Decide)
                .collect();
            assert_eq!(deciding.len(), 1, "{k}: {deciding:?}");
            assert_eq!(Some(deciding[0]), w.ring.owner(&k));
        }
        // Its own targets, each replica decides; another's, never.
        let k = key("example.com", "Widget", "shop", "w0");
        assert_eq!(decide(&w, "a", Some("a"), &k, now), Gate::Decide);
        assert_eq!(decide(&w, "a", Some("b"), &k, now), Gate::NotMine);
        assert_eq!(decide(&w, "a", None, &k, now), Gate::NotMine);
    }

    #[test]
    fn a_gone_members_targets_wait_while_it_may_still_act() {
        let now = Instant::now();
        let k = (0..100)
            .map(|i| key("", "ConfigMap", "shop", &format!("t{i}")))
            .find(|k| Ring::new(["a", "b"]).owner(k) == Some("a"))
            .unwrap();
        // Live by this replica's own clock, though published gone.
        let w = world(&["a", "b", "d"], &["a", "b"], &["d"], now);
        assert_eq!(decide(&w, "a", Some("d"), &k, now), Gate::NotYet);
        // A look too old to act on.
        let w = world(&["a", "b"], &["a", "b"], &["d"], now);
        let later = now + Duration::from_secs(11);
        assert_eq!(decide(&w, "a", Some("d"), &k, later), Gate::NotYet);
        assert_eq!(decide(&w, "a", Some("d"), &k, now), Gate::Decide);
        // Not published gone (a label nobody knows): placed first.
        let w = world(&["a", "b"], &["a", "b"], &[], now);
        assert_eq!(decide(&w, "a", Some("d"), &k, now), Gate::NotMine);
        // A replica not in the ring decides for no gone member's target.
        let w = world(&["a", "b", "e"], &["b"], &["d"], now);
        assert_eq!(decide(&w, "e", Some("d"), &k, now), Gate::NotMine);
    }

    /// A replica that came back under the identity of a gone member does
    /// not decide for the targets still labelled for it, and a look from
    /// before it began leading is not enough to decide anything.
    #[test]
    fn a_replica_counted_gone_does_not_decide_for_its_old_targets() {
        let now = Instant::now();
        let k = key("", "ConfigMap", "shop", "t1");
        let w = world(&["a", "d"], &["a"], &["d"], now);
        assert_eq!(decide(&w, "d", Some("d"), &k, now), Gate::NotMine);
        let w = world(&["a", "d"], &["a", "d"], &[], now);
        let knowledge = Knowledge {
            me: "d",
            view: &w.view,
            published: &w.published,
            ring: &w.ring,
            gained: Some(now + Duration::from_millis(1)),
            fresh: Duration::from_secs(10),
        };
        assert_eq!(gate(&knowledge, now, Some("d"), || k.clone()), Gate::NotYet);
    }

    #[test]
    fn members_join_the_ring_only_while_none_is_gone() {
        let none = BTreeSet::new();
        // Nothing published yet: the live members form the ring once
        // those starting together are all seen.
        let first = next_ring(
            &Published::default(),
            &set(&["a", "b"]),
            &none,
            Joining {
                settled: true,
                quiet: false,
                closed: true,
            },
        );
        assert_eq!(first.members, set(&["a", "b"]));
        let early = next_ring(
            &Published::default(),
            &set(&["a"]),
            &none,
            Joining {
                settled: false,
                quiet: true,
                closed: true,
            },
        );
        assert!(early.members.is_empty());
        // d stops: gone, and e, joining, waits.
        let p = published(&["a", "b", "d"], &[]);
        let next = next_ring(
            &p,
            &set(&["a", "b", "e"]),
            &none,
            Joining {
                settled: true,
                quiet: true,
                closed: true,
            },
        );
        assert_eq!(next.members, set(&["a", "b"]));
        assert_eq!(next.gone, set(&["d"]));
        // d's targets all placed: cleared; e joins once none has been
        // gone for a while.
        let next = next_ring(
            &next,
            &set(&["a", "b", "e"]),
            &set(&["d"]),
            Joining {
                settled: true,
                quiet: false,
                closed: true,
            },
        );
        assert_eq!(next.members, set(&["a", "b"]));
        assert!(next.gone.is_empty());
        let next = next_ring(
            &next,
            &set(&["a", "b", "e"]),
            &none,
            Joining {
                settled: true,
                quiet: true,
                closed: true,
            },
        );
        assert_eq!(next.members, set(&["a", "b", "e"]));
        // Every member gone: the new ones form the ring and take over.
        let p = published(&["a", "b"], &[]);
        let next = next_ring(
            &p,
            &set(&["x", "y"]),
            &none,
            Joining {
                settled: true,
                quiet: false,
                closed: true,
            },
        );
        assert_eq!(next.members, set(&["x", "y"]));
        assert_eq!(next.gone, set(&["a", "b"]));
    }

    /// Unplaced targets are decided where the published ring places them,
    /// by exactly one member, only while the ring is open and the look
    /// recent; a replica outside the ring decides none.
    #[test]
    fn unplaced_targets_are_decided_by_the_ring_while_it_is_open() {
        let now = Instant::now();
        let w = world(&["a", "b", "c"], &["a", "b", "c"], &[], now);
        for i in 0..200 {
            let k = key("example.com", "Widget", "shop", &format!("w{i}"));
            let deciding: Vec<&str> = ["a", "b", "c"]
                .into_iter()
                .filter(|me| decide(&w, me, None, &k, now) == Gate::Decide)
                .collect();
            assert_eq!(deciding.len(), 1, "{k}: {deciding:?}");
            assert_eq!(Some(deciding[0]), w.ring.owner(&k));
        }
        let k = (0..100)
            .map(|i| key("", "ConfigMap", "shop", &format!("t{i}")))
            .find(|k| w.ring.owner(k) == Some("a"))
            .unwrap();
        let later = now + Duration::from_secs(11);
        assert_eq!(decide(&w, "a", None, &k, later), Gate::NotYet);
        let mut closed = world(&["a", "b", "c"], &["a", "b", "c"], &[], now);
        closed.published.open = false;
        closed.view.published = Some(closed.published.clone());
        assert_eq!(decide(&closed, "a", None, &k, now), Gate::NotMine);
        let outside = world(&["a", "b", "c", "e"], &["a", "b", "c"], &[], now);
        assert_eq!(decide(&outside, "e", None, &k, now), Gate::NotMine);
        // What this replica's watch beside its own selects follows.
        let mut known = Known::default();
        known.observe(w.view.clone());
        assert_eq!(known.unplaced_ring("a"), Some(set(&["a", "b", "c"])));
        assert_eq!(known.unplaced_ring("e"), None);
        known.observe(closed.view.clone());
        assert_eq!(known.unplaced_ring("a"), None);
    }

    /// A member joins a ring that decides for unplaced targets only after
    /// the ring was published closed for a lease duration; a ring with a
    /// gone member is closed; a new ring opens at once.
    #[test]
    fn a_member_joins_an_open_ring_only_after_it_was_closed() {
        let none = BTreeSet::new();
        let joining = |closed| Joining {
            settled: true,
            quiet: true,
            closed,
        };
        let first = next_ring(
            &Published::default(),
            &set(&["a", "b"]),
            &none,
            joining(false),
        );
        assert_eq!(first.members, set(&["a", "b"]));
        assert!(first.open);
        let live = set(&["a", "b", "e"]);
        let pause = next_ring(&first, &live, &none, joining(false));
        assert_eq!(pause.members, set(&["a", "b"]));
        assert!(!pause.open);
        let joined = next_ring(&pause, &live, &none, joining(true));
        assert_eq!(joined.members, live);
        assert!(joined.open);
        // Nobody joining: open again.
        let same = next_ring(&pause, &set(&["a", "b"]), &none, joining(false));
        assert!(same.open);
        // b stops: closed while it is gone.
        let gone = next_ring(&joined, &set(&["a", "e"]), &none, joining(false));
        assert_eq!(gone.gone, set(&["b"]));
        assert!(!gone.open);
        let cleared = next_ring(&gone, &set(&["a", "e"]), &set(&["b"]), joining(false));
        assert!(cleared.open && cleared.gone.is_empty());
    }
}
