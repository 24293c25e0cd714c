//! Sharding: the replicas of one ring share the targets, each deciding for
//! those the consistent-hash ring (`runbook_core::shard`) places on it.
//!
//! The rest of the runtime goes through this door only: the selector a
//! kind's watch takes (`watch_selector`, `Shares` over the labels of gone
//! members), the children's selector, the check a reconcile makes before
//! it decides (`admit`), and the assigner's loop the operator starts
//! (`run`, over the member Leases of `members`), and where the authorship
//! webhook places a target being created (`place_new`). Inside: `members` reads
//! and publishes who is live, `assign` is the assigner (publish the next
//! ring, label targets for their places), `takeover` decides what a
//! replica may do for a gone member's targets before they are relabelled,
//! and `shares` merges a replica's own watch with those of gone members.
//! The decisions of all three are plain state machines, stepped by thin
//! I/O loops with the time passed in and unit-tested without a cluster:
//! the assigner (`Assigner::look`, `Assigner::published`, `next_ring`),
//! what a replica knows of the ring (`takeover::Known::observe`, `gate`),
//! and the merge of the watches (`shares::Merge::step`).

mod assign;
mod members;
mod shares;
mod takeover;

pub(crate) use assign::admit;
pub use assign::{
    children_selector, none_match, place_new, run, shard_identity, unheld_selector, watch_selector,
};
pub use members::{
    GONE_ANNOTATION, MEMBERS_ANNOTATION, Members, UNPLACED_ANNOTATION, member_lease, published_name,
};
pub use shares::Unheld;
pub(crate) use shares::{Parts, PlacesHere, Shares, StartGone, Watch};
pub use takeover::Placement;
