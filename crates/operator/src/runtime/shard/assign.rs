//! Sharded replicas (`--shards`): which replica decides for which target.
//! Every replica holds a member Lease (`members`) and watches only the
//! targets labelled `runbook.dev/shard: <its identity>`. The replica that
//! holds the ring's own Lease (the one a single leader would hold) is the
//! assigner: it places each target on the ring of live members and
//! labels it.
//!
//! - A target without the label is decided by the replica the published
//!   ring places it on before it is labelled (`takeover`), and labelled
//!   for its place a lease duration after that ring opened.
//! - A target labelled for a member that is gone is labelled for its
//!   place a lease duration after (a member gone has stopped acting: see
//!   `members`); meanwhile the others decide for it (`takeover`).
//! - A target whose place moved to another live member is moved by a
//!   handshake, so that two replicas never decide for it at once: the
//!   assigner labels it `runbook.dev/drain`; its member, in its next
//!   reconcile of it (none other runs for it then), stops deciding for it
//!   and takes both labels off; then the assigner labels it for its new
//!   place.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::Api;
use kube::api::ObjectMeta;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::runtime::controller::Action;
use runbook_core::observe::Labels;
use serde_json::json;

use super::members::{Members, Published, published_name};
use super::takeover::{Ask, Gate, Joining, next_ring};
use crate::runtime::context::Context;
use crate::runtime::leader::{Elector, LeaseConfig, look_every};
use runbook_core::clock::Clock;
use runbook_core::kinds::KindRef;
use runbook_core::shard::{DRAIN_LABEL, PLACED_ANNOTATION, Ring, SHARD_LABEL, key};

/// A full pass (every target looked at, moves included) every this many
/// looks, besides one whenever the members change; between them only
/// targets without the label are looked for.
const FULL_EVERY: u32 = 30;

/// Targets listed at once while placing. Each page is read through a
/// pooled connection whose read buffer grows to hold it and stays grown
/// while the connection lives: pages of 500 (about 350 KB of metadata)
/// grew the assigner's buffers by several MB at 10,000 targets, pages of
/// 100 keep each one within about 128 KB.
const PAGE: u32 = 100;

/// Labels written at once while placing. Nobody waits on them to decide
/// for a gone member's targets (see `takeover`); each one in flight holds
/// a connection and its buffers on the assigner (64 cost it about 6 MB
/// more than 16 at 10,000 targets on the sandbox, for no faster start).
const PLACING_AT_ONCE: usize = 16;

/// How often the members are looked at while the ring has none.
const FORMING_POLL: Duration = Duration::from_millis(100);

/// The selector of the targets a sharded replica watches for its own
/// share, with the policies' own (`selector`); unchanged without
/// `--shards`. Those of gone members are watched beside (`shares`).
pub fn watch_selector(ctx: &Context, selector: Option<&str>) -> Option<String> {
    if !ctx.config.shards {
        return selector.map(str::to_string);
    }
    let own = format!("{SHARD_LABEL}={}", ctx.config.identity);
    Some(with_policies(selector, own))
}

/// The selector of the targets a sharded replica watches beside its own
/// (`shares::Unheld`), with the policies' own; `None` for none.
pub fn unheld_selector(selector: Option<&str>, unheld: &super::Unheld) -> Option<String> {
    Some(with_policies(selector, unheld.selection()?))
}

fn with_policies(selector: Option<&str>, shard: String) -> String {
    match selector {
        Some(s) if !s.is_empty() => format!("{s},{shard}"),
        _ => shard,
    }
}

/// Whether `identity` can name a replica's share: it is the value of the
/// label that places targets.
pub fn shard_identity(identity: &str) -> Result<(), String> {
    match identity {
        "" => Err("the identity labels this replica's targets, and is empty".into()),
        id => runbook_core::labels::check_value(id)
            .map_err(|why| format!("the identity labels this replica's targets: {why}")),
    }
}

/// The selector of a kind's cache on a sharded replica: its own share,
/// for a kind every policy only owns (children, labelled as their
/// targets are); `None` (everything) for any other, and unsharded.
pub fn children_selector(
    ctx: &Context,
    set: &runbook_core::policy::PolicySet,
    kind: &KindRef,
) -> Option<String> {
    use runbook_core::kinds::Role;
    if !ctx.config.shards {
        return None;
    }
    let only_children = set.policies.values().all(|p| {
        !p.kinds.declares(kind)
            || (p.kinds.has(kind, Role::Owns)
                && [Role::Target, Role::Reads, Role::Mutates, Role::Deletes]
                    .iter()
                    .all(|r| !p.kinds.has(kind, *r)))
    });
    only_children.then(|| shard_selector(ctx))
}

/// The shard labels a sharded replica watches: its own, and those of the
/// members gone whose targets it may decide for (`takeover`).
fn shard_selector(ctx: &Context) -> String {
    let mut labels = ctx.running.placement.watched();
    if labels.is_empty() {
        return format!("{SHARD_LABEL}={}", ctx.config.identity);
    }
    labels.insert(ctx.config.identity.clone());
    super::shares::shard_label(&labels, true)
}

fn api(ctx: &Context, kind: &KindRef, namespace: Option<&str>) -> Api<DynamicObject> {
    let (ar, namespaced) = ctx.resources.served_as(kind);
    match (namespace.or(ctx.config.namespace.as_deref()), namespaced) {
        (Some(ns), true) if !ns.is_empty() => Api::namespaced_with(ctx.client.clone(), ns, &ar),
        _ => Api::all_with(ctx.client.clone(), &ar),
    }
}

/// Whether this replica, sharded, decides for a target now; `Some`: it
/// does not, and the reconcile ends with this action. A target moving
/// to another replica is let go, undecided; otherwise only its own
/// targets and those of gone members the published ring places here are
/// decided (`takeover`).
pub(crate) async fn admit(
    ctx: &Context,
    kind: &KindRef,
    namespace: &str,
    name: &str,
    labels: &Labels,
) -> Option<Action> {
    let lease = ctx.config.lease.as_ref().filter(|_| ctx.config.shards)?;
    match let_go(ctx, kind, namespace, name, labels).await {
        Some(true) => return Some(Action::await_change()),
        Some(false) => return Some(Action::requeue(Duration::from_secs(1))),
        None => {}
    }
    let label = labels.get(SHARD_LABEL);
    let ring_key = || key(kind.group(), &kind.kind, namespace, name);
    let ask = Ask {
        me: &ctx.config.identity,
        label,
        fresh: lease.duration,
    };
    match ctx.running.placement.gate(ask, ring_key) {
        Gate::Decide => None,
        Gate::NotMine => Some(Action::await_change()),
        Gate::NotYet => Some(Action::requeue(look_every(lease.duration))),
    }
}

/// Where the authorship webhook places a target being created (see
/// `admission::review::Placer`): the member the published ring puts it
/// on, when some policy's selector selects it in the namespaces this
/// replica places (those the assigner would label it in). `None` leaves
/// it to the assigner: a generated name (not known yet), no ring
/// published yet, no policy for it.
pub fn place_new(ctx: &Context, object: &serde_json::Value) -> Option<String> {
    ctx.config.lease.as_ref().filter(|_| ctx.config.shards)?;
    let text = |p: &str| object.pointer(p).and_then(serde_json::Value::as_str);
    let name = text("/metadata/name").filter(|n| !n.is_empty())?;
    let namespace = text("/metadata/namespace").unwrap_or("");
    if let Some(only) = ctx.config.namespace.as_deref().filter(|n| !n.is_empty())
        && namespace != only
    {
        return None;
    }
    let kind = KindRef::new(text("/apiVersion")?, text("/kind")?);
    let selected = ctx
        .policies
        .load()
        .for_target(&kind)
        .iter()
        .any(|p| p.selector.is_empty() || p.selector.matches_object(object));
    if !selected {
        return None;
    }
    ctx.running
        .placement
        .owner(&key(kind.group(), &kind.kind, namespace, name))
}

/// The member's side of a move: a target labelled to drain is let go
/// (both labels off) and not decided for. `None`: it is not draining;
/// `Some(true)`: let go; `Some(false)`: letting go failed (try again).
async fn let_go(
    ctx: &Context,
    kind: &KindRef,
    namespace: &str,
    name: &str,
    labels: &Labels,
) -> Option<bool> {
    if !labels.contains_key(DRAIN_LABEL) {
        return None;
    }
    let patch = json!({"metadata": {
        "labels": {SHARD_LABEL: null, DRAIN_LABEL: null},
        "annotations": {PLACED_ANNOTATION: null},
    }});
    let ns = (!namespace.is_empty()).then_some(namespace);
    match api(ctx, kind, ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::info!(kind = %kind, namespace, name, "let a target go to another replica");
            Some(true)
        }
        // Gone meanwhile: nothing to let go.
        Err(kube::Error::Api(s)) if s.code == 404 => Some(true),
        Err(e) => {
            tracing::warn!(kind = %kind, namespace, name, "letting a target go: {}", crate::util::api_error(&e));
            Some(false)
        }
    }
}

/// The assigner's state machine: what it keeps from one look at the
/// members to the next. It does no I/O and reads no clock: `run` steps it
/// with each look (`look`), the ring it published (`published`) and the
/// end of a placing (`placed`), passing the time in.
#[derive(Debug)]
struct Assigner {
    /// The ring members' lease duration.
    lease: Duration,
    /// How many replicas start together, where the operator was told.
    expected: Option<usize>,
    /// The ring placed by the last full or new pass.
    last: Option<Ring>,
    looks: u32,
    /// Since when each member has been live, as this replica saw it.
    joined: HashMap<String, Instant>,
    /// Since when no member has been gone, as published.
    none_gone: Option<Instant>,
    /// Since when the gone members published are these.
    gone_since: Option<(BTreeSet<String>, Instant)>,
    /// Whether a member joined within the last `settle` at the last look.
    settling: bool,
    /// A placing is under way (labels are written while the members are
    /// looked at).
    placing: bool,
    /// The gone members the last placing found all placed.
    cleared: BTreeSet<String>,
    /// Since when the published ring has not decided for unplaced
    /// targets (published so by this assigner).
    closed_since: Option<Instant>,
    /// Since when the ring of these members has decided for them.
    open_since: Option<(BTreeSet<String>, Instant)>,
}

/// What one turn places, once the ring is published.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    ring: Ring,
    pass: Pass,
    /// The gone members whose targets this placing takes.
    gone: BTreeSet<String>,
    /// The ring differs from the one placed last (worth a log line).
    changed: bool,
    /// Whether unplaced targets are labelled: not while the replicas
    /// decide for them as the ring places them, for a lease duration
    /// after it opened; their labels follow then.
    unplaced: bool,
}

impl Assigner {
    fn new(lease: Duration, expected: Option<usize>) -> Self {
        Self {
            lease,
            expected,
            last: None,
            looks: 0,
            joined: HashMap::new(),
            none_gone: None,
            gone_since: None,
            settling: false,
            placing: false,
            cleared: BTreeSet::new(),
            closed_since: None,
            open_since: None,
        }
    }

    /// A look at the members at `now`: `live` by this replica's clock,
    /// the ring `published`, and whether this replica holds the ring's
    /// Lease. Returns the ring to publish next, on the assigner only; a
    /// replica that is not (or no longer) the assigner forgets the ring it
    /// placed, so that when it assigns again it places every target.
    fn look(
        &mut self,
        live: &BTreeSet<String>,
        published: &Published,
        assigning: bool,
        now: Instant,
    ) -> Option<Published> {
        self.joined.retain(|m, _| live.contains(m));
        for m in live {
            self.joined.entry(m.clone()).or_insert(now);
        }
        if !assigning {
            self.last = None;
            self.none_gone = None;
            self.closed_since = None;
            self.open_since = None;
            return None;
        }
        if published.gone.is_empty() {
            self.none_gone.get_or_insert(now);
        } else {
            self.none_gone = None;
        }
        // Replicas that start together join one after another, and none
        // joins while a member's targets are decided as a gone member's.
        // A replica's look at the members serves it for a lease duration
        // (see `takeover::gate`), so none joins until a lease duration
        // after the last gone member's targets were all placed: no look
        // that still counts a member gone is used once it is back.
        // Into an empty ring, all those expected to start together join
        // as soon as they are live: nobody is left to wait for.
        let settle = settle(self.lease);
        let all_here =
            published.members.is_empty() && self.expected.is_some_and(|n| n > 0 && live.len() >= n);
        self.settling = !all_here
            && self
                .joined
                .values()
                .any(|t| now.saturating_duration_since(*t) < settle);
        let quiet = self
            .none_gone
            .is_some_and(|t| now.saturating_duration_since(t) >= self.lease);
        let joining = Joining {
            settled: !self.settling,
            quiet,
            closed: self
                .closed_since
                .is_some_and(|t| now.saturating_duration_since(t) >= self.lease),
        };
        Some(next_ring(published, live, &self.cleared, joining))
    }

    /// The ring `next` is published (after a `look`): what to place now,
    /// if anything. Nothing while a placing is under way, while the gone
    /// members' targets wait (`relabel_later`), or with nobody in the
    /// ring.
    fn published(&mut self, next: &Published, now: Instant) -> Option<Place> {
        self.cleared.clear();
        if next.open {
            self.closed_since = None;
            if self
                .open_since
                .as_ref()
                .is_none_or(|(m, _)| *m != next.members)
            {
                self.open_since = Some((next.members.clone(), now));
            }
        } else {
            self.closed_since.get_or_insert(now);
            self.open_since = None;
        }
        let unplaced = self
            .open_since
            .as_ref()
            .is_none_or(|(_, t)| now.saturating_duration_since(*t) >= self.lease);
        if self.placing || relabel_later(&mut self.gone_since, &next.gone, self.lease, now) {
            return None;
        }
        let ring = match self.last.as_ref() {
            Some(r) if r.members().iter().eq(next.members.iter()) => r.clone(),
            _ => next.ring(),
        };
        if ring.is_empty() {
            self.last = None;
            return None;
        }
        let pass = self.pass(&ring);
        let changed = self.last.as_ref() != Some(&ring);
        if pass != Pass::Gone {
            self.last = Some(ring.clone());
        }
        self.placing = true;
        Some(Place {
            ring,
            pass,
            gone: next.gone.clone(),
            changed,
            unplaced,
        })
    }

    /// The placing under way ended, finding the targets of `cleared` (gone
    /// members) all placed elsewhere: the next ring published drops them.
    fn placed(&mut self, cleared: BTreeSet<String>) {
        self.placing = false;
        self.cleared = cleared;
    }

    /// Which targets this turn places. While one has just joined, only a
    /// gone member's, so that start-up does not give everything to the
    /// first and then move most of it; otherwise every target when the
    /// ring changed (and every [`FULL_EVERY`] looks), else the new ones.
    fn pass(&mut self, now: &Ring) -> Pass {
        if self.settling {
            return Pass::Gone;
        }
        self.looks += 1;
        if self.last.as_ref() != Some(now) || self.looks.is_multiple_of(FULL_EVERY) {
            Pass::Full
        } else {
            Pass::New
        }
    }
}

/// Run the assigner while this replica holds the ring's Lease, until the
/// operator stops. Every replica looks at the members here, for its own
/// view of them (`takeover`) and its alerts. This is the I/O around
/// [`Assigner`]: read the members, publish the ring, place the targets.
pub async fn run(ctx: Arc<Context>, ring: LeaseConfig) {
    let assigning = Arc::new(AtomicBool::new(false));
    let (changed, _) = tokio::sync::watch::channel(false);
    let elector = Elector::new(ctx.client.clone(), ring.clone(), Clock::real());
    let election = tokio::spawn(elector.run(assigning.clone(), changed, ctx.stop.clone()));
    let mut members = Members::new(ctx.client.clone(), &ring);
    let mut stop = ctx.stop.clone();
    let mut state = Assigner::new(ring.duration, ctx.config.shard_replicas);
    let mut placing: Option<tokio::task::JoinHandle<BTreeSet<String>>> = None;
    let mut forming = true;
    loop {
        // While the ring has no member, those starting are looked for
        // more often: nothing is decided until it has.
        let wait = match forming {
            true => members.poll().min(FORMING_POLL),
            false => members.poll(),
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let view = match members.look().await {
            Ok(view) => view,
            Err(e) => {
                tracing::warn!(
                    "reading the members' Leases: {}",
                    crate::util::api_error(&e)
                );
                continue;
            }
        };
        let (live, published) = (
            view.live.clone(),
            view.published.clone().unwrap_or_default(),
        );
        forming = published.members.is_empty();
        if ctx.running.placement.observe(&ctx.config.identity, view) {
            tracing::info!(gone = ?ctx.running.placement.watched(), "deciding for the targets of members gone, as the published ring places them");
        }
        let assigner = assigning.load(Ordering::Acquire);
        gather_alerts(&ctx, assigner, &live).await;
        if assigner
            && placing.as_ref().is_some_and(|p| p.is_finished())
            && let Some(done) = placing.take()
        {
            state.placed(done.await.unwrap_or_default());
        }
        let Some(next) = state.look(&live, &published, assigner, Instant::now()) else {
            continue;
        };
        let next = match publish(&ctx, &ring, &published, next).await {
            Ok(next) => next,
            Err(e) => {
                let e = crate::util::api_error(&e);
                tracing::warn!("publishing the ring of replicas: {e}");
                continue;
            }
        };
        if let Some(place) = state.published(&next, Instant::now()) {
            placing = Some(tokio::spawn(place_all(ctx.clone(), place, live)));
        }
    }
    if let Some(p) = placing {
        p.abort();
    }
    // Stopped: another replica notifies from now on.
    gather_alerts(&ctx, false, &Default::default()).await;
    let _ = election.await;
}

/// Place every target kind's targets as `place` says; returns the gone
/// members whose targets are all placed elsewhere now.
async fn place_all(ctx: Arc<Context>, place: Place, live: BTreeSet<String>) -> BTreeSet<String> {
    if place.changed && place.pass != Pass::Gone {
        tracing::info!(members = ?place.ring.members(), "the ring of replicas");
    }
    let gone = !place.gone.is_empty();
    for kind in ctx.policies.load().target_kinds() {
        if let Err(e) = self::place(&ctx, &kind, &place, &live, gone).await {
            tracing::warn!(kind = %kind, "placing targets: {}", crate::util::api_error(&e));
        }
    }
    all_placed(&ctx, &place.gone).await
}

/// Whether the targets of members just counted gone are labelled for
/// their new places later. For a lease duration after the gone members
/// change, the others decide for their targets as the published ring
/// places them (`takeover`) and nothing is placed: the labels (a write per
/// target, and a reconcile by its new replica) would otherwise compete
/// with those decisions for the API server and the replicas. New targets
/// wait as long to be placed.
fn relabel_later(
    since: &mut Option<(BTreeSet<String>, Instant)>,
    gone: &BTreeSet<String>,
    lease: Duration,
    now: Instant,
) -> bool {
    if gone.is_empty() {
        *since = None;
        return false;
    }
    match since {
        // The same, or fewer (one's targets are all placed): as long as
        // they have been gone.
        Some((g, t)) if gone.is_subset(g) => {
            *g = gone.clone();
            now.saturating_duration_since(*t) < lease
        }
        _ => {
            *since = Some((gone.clone(), now));
            true
        }
    }
}

/// How long members that join wait for others starting with them.
fn settle(lease: Duration) -> Duration {
    (lease / 5).clamp(Duration::from_millis(200), Duration::from_secs(3))
}

/// Write the ring the assigner places by, where it changed; returns it as
/// published. Replacing the record read is a compare-and-swap: a record
/// written meanwhile (by an assigner before this one) fails it.
async fn publish(
    ctx: &Context,
    ring: &LeaseConfig,
    old: &Published,
    next: Published,
) -> Result<Published, kube::Error> {
    if old.version.is_some()
        && next.members == old.members
        && next.gone == old.gone
        && next.open == old.open
    {
        return Ok(next);
    }
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), &ring.namespace);
    let name = published_name(&ring.name);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ring.namespace.clone()),
            resource_version: old.version.clone(),
            annotations: Some(next.annotations()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(ring.identity.clone()),
            ..Default::default()
        }),
    };
    let written = match old.version {
        Some(_) => api.replace(&name, &PostParams::default(), &lease).await?,
        None => api.create(&PostParams::default(), &lease).await?,
    };
    tracing::info!(members = ?next.members, gone = ?next.gone, unplaced_by_ring = next.open, "published the ring of replicas");
    Ok(Published {
        version: written.metadata.resource_version,
        ..next
    })
}

/// The gone members none of whose targets carries their label any more.
async fn all_placed(ctx: &Context, gone: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    'members: for g in gone {
        for kind in ctx.policies.load().target_kinds() {
            if !none_match(&api(ctx, &kind, None), &format!("{SHARD_LABEL}={g}")).await {
                continue 'members;
            }
        }
        out.insert(g.clone());
    }
    out
}

/// Whether no object matches a label selection; false if it cannot tell.
/// Asked of storage for one object at most: it is asked while objects
/// still match (a gone member's targets being labelled elsewhere), where
/// the first few it reads answer, and a stale cache must not answer "none"
/// early. Only the last look, which finds none, reads every object of the
/// kind. (The watch cache would answer with every match at once: kube
/// sends no `resourceVersion=0` along with a limit.)
pub async fn none_match(api: &Api<DynamicObject>, selector: &str) -> bool {
    let one = ListParams::default().labels(selector).limit(1);
    api.list_metadata(&one)
        .await
        .is_ok_and(|l| l.items.is_empty())
}

/// Publish this replica's alerts and, on the assigner, notify everyone's
/// (see `alert::shared`).
async fn gather_alerts(ctx: &Context, notifying: bool, live: &std::collections::BTreeSet<String>) {
    let set = ctx.policies.load_full();
    let routes = |policy: &str| set.policies.get(policy).and_then(|p| set.routes_for(p));
    ctx.alerts.gather(notifying, live, &routes).await;
}

/// Which targets a look at them places.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Only those of members that are gone.
    Gone,
    /// Those without a place too.
    New,
    /// Every one: moves to new members too.
    Full,
}

/// Label the targets of one kind for their places (`pass` says which).
/// Objects no policy selects are left unlabelled.
async fn place(
    ctx: &Context,
    kind: &KindRef,
    place: &Place,
    live: &BTreeSet<String>,
    gone: bool,
) -> Result<(), kube::Error> {
    let (ring, pass) = (&place.ring, place.pass);
    let api = api(ctx, kind, None);
    // Each selection, and whether the API server's watch cache serves it
    // (see below).
    let mut selections: Vec<(String, bool)> = match pass {
        Pass::Gone => Vec::new(),
        Pass::New | Pass::Full if !place.unplaced => Vec::new(),
        Pass::New | Pass::Full => unplaced_selectors(&ctx.policies.load(), kind)
            .into_iter()
            .map(|s| (s, true))
            .collect(),
    };
    // Labelled for members not in the ring, found by the API server.
    let outside = format!(
        "{SHARD_LABEL},{SHARD_LABEL} notin ({})",
        ring.members().join(",")
    );
    match pass {
        Pass::Full => selections.push((SHARD_LABEL.to_string(), false)),
        Pass::Gone => selections.push((outside, true)),
        Pass::New if gone => selections.push((outside, true)),
        Pass::New => {}
    }
    for (selection, cacheable) in selections {
        // Each look at what is unplaced or a gone member's is served by
        // the API server's watch cache where it found few the last time:
        // found on storage, a selection that matches nothing reads every
        // target of the kind, twice a second (at 20,000 targets that kept
        // a real API server at 90% of 2 cores). A stale look is harmless:
        // each label written is a compare-and-swap on the resourceVersion
        // seen. The full pass, and a look that found many (at start-up),
        // read storage a page at a time (the cache answers whole).
        let look = format!("{kind} {selection}");
        let seen = &ctx.running.placement;
        let cached = cacheable && seen.cache_serves(&look, PAGE as usize);
        let found = std::sync::atomic::AtomicUsize::new(0);
        let pages = Look {
            selection: &selection,
            page: PAGE,
            cached,
        };
        each_page(&api, pages, |items| {
            found.fetch_add(items.len(), Ordering::Relaxed);
            async move {
            // Labelled a few at a time: a thousand new targets, or a gone
            // member's share, are placed within the lease duration.
            let patches: Vec<(Option<String>, String, serde_json::Value)> = items
                .into_iter()
                .filter_map(|o| {
                    let patch = placement(kind, &o.metadata, ring, live)?;
                    Some((o.metadata.namespace, o.metadata.name?, patch))
                })
                .collect();
            futures::stream::iter(patches)
                .for_each_concurrent(PLACING_AT_ONCE, |(ns, name, patch)| async move {
                    let api = self::api(ctx, kind, ns.as_deref());
                    if let Err(e) = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        tracing::warn!(kind = %kind, name, "placing a target: {}", crate::util::api_error(&e));
                    }
                })
                .await;
            }
        })
        .await?;
        seen.looked(&look, found.load(Ordering::Relaxed));
    }
    Ok(())
}

/// How many times a look at a selection starts again when its continue
/// token expired.
const RESTARTS: u32 = 3;

/// One look at the targets of a kind, page by page.
#[derive(Clone, Copy)]
struct Look<'a> {
    /// The label selection.
    selection: &'a str,
    /// Objects a page holds at most.
    page: u32,
    /// Whether the API server's watch cache may answer.
    cached: bool,
}

/// The metadata of the objects a label selection finds, a page at a time
/// (so that placing many targets costs the assigner no more memory than a
/// page), each page handed to `each` before the next is asked for;
/// `cached`: from the API server's watch cache (which may answer with
/// every object at once), the pages after the first from storage. Where
/// the continue token expired meanwhile (410 Gone, after the API server's
/// storage was compacted), the look starts again from the first page, up
/// to `RESTARTS` times: the objects seen again are placed already, and
/// nothing is done for them twice.
async fn each_page<F, Fut>(
    api: &Api<DynamicObject>,
    look: Look<'_>,
    mut each: F,
) -> Result<(), kube::Error>
where
    F: FnMut(Vec<kube::core::PartialObjectMeta<DynamicObject>>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Look {
        selection,
        page: limit,
        cached,
    } = look;
    let paged = ListParams::default().labels(selection).limit(limit);
    // Without a limit: kube sends no `resourceVersion=0` along with one
    // (see `cache::watch_config`).
    let first = match cached {
        true => ListParams::default().labels(selection).match_any(),
        false => paged.clone(),
    };
    let (mut params, mut restarts) = (first.clone(), 0);
    loop {
        let page = match api.list_metadata(&params).await {
            Ok(page) => page,
            Err(kube::Error::Api(e))
                if e.code == 410 && params.continue_token.is_some() && restarts < RESTARTS =>
            {
                restarts += 1;
                tracing::info!(
                    selection,
                    restarts,
                    "the list's continue token expired; looking again from the start"
                );
                params = first.clone();
                continue;
            }
            Err(e) => return Err(e),
        };
        each(page.items).await;
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            // A continue token carries its own resourceVersion.
            Some(c) => params = paged.clone().continue_token(&c),
            None => return Ok(()),
        }
    }
}

/// The label selections that find a kind's unplaced targets: one per
/// policy selector, or all of the kind where a policy selects every one.
fn unplaced_selectors(set: &runbook_core::policy::PolicySet, kind: &KindRef) -> Vec<String> {
    let unplaced = format!("!{SHARD_LABEL}");
    let mut out: Vec<String> = Vec::new();
    for p in set.for_target(kind) {
        if p.selector.is_empty() {
            return vec![unplaced];
        }
        let s = format!("{},{unplaced}", p.selector);
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The label change a target needs for its place on the ring, if any.
fn placement(
    kind: &KindRef,
    m: &ObjectMeta,
    ring: &Ring,
    live: &BTreeSet<String>,
) -> Option<serde_json::Value> {
    let k = key(
        kind.group(),
        &kind.kind,
        m.namespace.as_deref().unwrap_or(""),
        m.name.as_deref()?,
    );
    let want = ring.owner(&k)?;
    let labels = m.labels.as_ref();
    let now = labels.and_then(|l| l.get(SHARD_LABEL)).map(String::as_str);
    let draining = labels.is_some_and(|l| l.contains_key(DRAIN_LABEL));
    // The resourceVersion makes each change a compare-and-swap: nothing
    // is labelled from a stale look.
    let version = m.resource_version.clone();
    match now {
        Some(member) if member == want => None,
        // Its member is live (in the ring or not): it lets the target go
        // first.
        Some(member) if live.contains(member) => (!draining).then(
            || json!({"metadata": {"resourceVersion": version, "labels": {DRAIN_LABEL: "true"}}}),
        ),
        // Unplaced, or its member is gone: placed here, not at its
        // creation (a mark of that would say so wrongly).
        _ => Some(json!({"metadata": {"resourceVersion": version,
            "labels": {SHARD_LABEL: want, DRAIN_LABEL: null},
            "annotations": {PLACED_ANNOTATION: null}}})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            resource_version: Some("7".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_gone_members_targets_are_relabelled_a_lease_after_it_is_gone() {
        let lease = Duration::from_millis(300);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut since = None;
        assert!(!relabel_later(&mut since, &set(&[]), lease, at(0)));
        assert!(relabel_later(&mut since, &set(&["g"]), lease, at(0)));
        assert!(relabel_later(&mut since, &set(&["g"]), lease, at(299)));
        assert!(!relabel_later(&mut since, &set(&["g"]), lease, at(300)));
        // Another gone: its targets wait a lease too.
        assert!(relabel_later(&mut since, &set(&["g", "h"]), lease, at(310)));
        // g's are all placed: h's still wait.
        assert!(relabel_later(&mut since, &set(&["h"]), lease, at(400)));
        assert!(!relabel_later(&mut since, &set(&["h"]), lease, at(610)));
        // Nobody gone: nothing waits, and the next one gone waits anew.
        assert!(!relabel_later(&mut since, &set(&[]), lease, at(620)));
        assert!(relabel_later(&mut since, &set(&["h"]), lease, at(630)));
    }

    /// The assigner's state machine, stepped as `run` steps it: a look at
    /// the members, the ring published, what to place.
    struct Steps {
        a: Assigner,
        t0: Instant,
        published: Published,
    }

    const LEASE: Duration = Duration::from_secs(10);

    impl Steps {
        fn new() -> Self {
            Self::expecting(None)
        }

        fn expecting(expected: Option<usize>) -> Self {
            Self {
                a: Assigner::new(LEASE, expected),
                t0: Instant::now(),
                published: Published::default(),
            }
        }

        /// One turn at `ms` with these members live, as the assigner:
        /// what it publishes and places (the publish succeeds).
        fn turn(&mut self, ms: u64, live: &[&str]) -> Option<Place> {
            let now = self.t0 + Duration::from_millis(ms);
            let next = self.a.look(&set(live), &self.published, true, now)?;
            self.published = next.clone();
            self.a.published(&next, now)
        }

        /// A turn whose placing ends at once, finding these gone members'
        /// targets all placed.
        fn turn_placed(&mut self, ms: u64, live: &[&str], cleared: &[&str]) -> Option<Place> {
            let place = self.turn(ms, live);
            if place.is_some() {
                self.a.placed(set(cleared));
            }
            place
        }
    }

    #[test]
    fn replicas_expected_together_join_as_soon_as_all_are_live() {
        let mut s = Steps::expecting(Some(3));
        // Two of three: they wait, as without the hint.
        assert!(s.turn_placed(0, &["a", "b"], &[]).is_none());
        assert!(s.published.members.is_empty());
        // The third, a moment later: all three join at once, and every
        // target is placed, without waiting to settle.
        let p = s.turn_placed(300, &["a", "b", "c"], &[]).unwrap();
        assert_eq!(s.published.members, set(&["a", "b", "c"]));
        assert_eq!((p.pass, p.changed), (Pass::Full, true));
        // A fourth, beyond the count, joins a ring that has members only
        // once settled and quiet, as any later replica does, and a lease
        // after the ring stopped deciding for unplaced targets.
        let p = s.turn_placed(10_500, &["a", "b", "c", "d"], &[]).unwrap();
        assert_eq!(p.pass, Pass::Gone);
        assert_eq!(s.published.members, set(&["a", "b", "c"]));
        assert!(s.published.open);
        s.turn_placed(13_000, &["a", "b", "c", "d"], &[]);
        assert_eq!(s.published.members, set(&["a", "b", "c"]));
        assert!(!s.published.open);
        s.turn_placed(22_000, &["a", "b", "c", "d"], &[]);
        assert_eq!(s.published.members, set(&["a", "b", "c"]));
        s.turn_placed(23_000, &["a", "b", "c", "d"], &[]);
        assert_eq!(s.published.members, set(&["a", "b", "c", "d"]));
        assert!(s.published.open);
    }

    /// Unplaced targets are decided where the new ring places them, and
    /// labelled only a lease after it opened; while it is closed (a
    /// member gone or waiting to join), at once.
    #[test]
    fn unplaced_targets_are_labelled_a_lease_after_the_ring_opened() {
        let mut s = Steps::expecting(Some(2));
        let p = s.turn_placed(0, &["a", "b"], &[]).unwrap();
        assert!(s.published.open);
        assert_eq!((p.pass, p.unplaced), (Pass::Full, false));
        assert!(!s.turn_placed(9_000, &["a", "b"], &[]).unwrap().unplaced);
        let p = s.turn_placed(10_000, &["a", "b"], &[]).unwrap();
        assert_eq!((p.pass, p.unplaced), (Pass::New, true));
        // c waits to join: closed, and the unplaced are labelled.
        s.turn_placed(20_000, &["a", "b", "c"], &[]);
        let p = s.turn_placed(23_000, &["a", "b", "c"], &[]).unwrap();
        assert!(!s.published.open && p.unplaced);
    }

    #[test]
    fn a_count_too_high_only_makes_those_starting_wait_to_settle() {
        let mut s = Steps::expecting(Some(5));
        assert!(s.turn_placed(0, &["a", "b"], &[]).is_none());
        assert!(s.turn_placed(1_000, &["a", "b"], &[]).is_none());
        s.turn_placed(2_500, &["a", "b"], &[]);
        assert_eq!(s.published.members, set(&["a", "b"]));
    }

    #[test]
    fn replicas_starting_together_join_once_settled_and_then_everything_is_placed() {
        let mut s = Steps::new();
        // The first members wait until those starting with them have been
        // seen (`settle`: a fifth of the lease, here 2 s): nobody is in the
        // ring yet, and nothing is placed.
        assert!(s.turn_placed(0, &["a", "b"], &[]).is_none());
        assert!(s.turn_placed(1_000, &["a", "b", "c"], &[]).is_none());
        assert!(s.published.members.is_empty());
        // c, seen last, has settled: the three join at once, and the
        // new ring places every target.
        let p = s.turn_placed(3_000, &["a", "b", "c"], &[]).unwrap();
        assert_eq!(s.published.members, set(&["a", "b", "c"]));
        assert_eq!((p.pass, p.changed), (Pass::Full, true));
        // A fourth starting later joins only once settled and quiet, and
        // while it settles, only gone members' targets are placed.
        let p = s.turn_placed(4_000, &["a", "b", "c", "d"], &[]).unwrap();
        assert_eq!(p.pass, Pass::Gone);
        assert_eq!(s.published.members, set(&["a", "b", "c"]));
        assert!(s.turn_placed(5_000, &["a", "b", "c"], &[]).is_some());
        let p = s.turn_placed(13_000, &["a", "b", "c", "d"], &[]).unwrap();
        assert_eq!(p.pass, Pass::Gone);
        s.turn_placed(15_000, &["a", "b", "c", "d"], &[]);
        assert!(!s.published.open, "closed a lease before d joins");
        s.turn_placed(25_000, &["a", "b", "c", "d"], &[]);
        assert_eq!(s.published.members, set(&["a", "b", "c", "d"]));
        // The same ring next: only new targets, with a full pass every
        // FULL_EVERY looks.
        let four = ["a", "b", "c", "d"];
        let p = s.turn_placed(26_000, &four, &[]).unwrap();
        assert_eq!((p.pass, p.changed), (Pass::New, false));
        let passes: Vec<Pass> = (0..FULL_EVERY as u64)
            .filter_map(|i| s.turn_placed(27_000 + i, &four, &[]))
            .map(|p| p.pass)
            .collect();
        assert_eq!(passes.iter().filter(|p| **p == Pass::Full).count(), 1);
    }

    #[test]
    fn a_member_gone_is_relabelled_a_lease_later_and_dropped_once_all_placed() {
        let mut s = Steps::new();
        s.turn_placed(0, &["a", "b"], &[]);
        s.turn_placed(20_000, &["a", "b"], &[]);
        // b stops renewing: published gone at once, its targets placed a
        // lease later (others decide for them meanwhile).
        assert!(s.turn_placed(21_000, &["a"], &[]).is_none());
        assert_eq!(
            (s.published.members.clone(), s.published.gone.clone()),
            (set(&["a"]), set(&["b"]))
        );
        assert!(s.turn_placed(30_000, &["a"], &[]).is_none());
        let p = s.turn(31_000, &["a"]).unwrap();
        assert_eq!((p.pass, p.gone.clone()), (Pass::Full, set(&["b"])));
        // The drain under way: nothing else is placed until it ends.
        assert!(s.turn(32_000, &["a"]).is_none());
        assert!(s.turn(33_000, &["a"]).is_none());
        // It ends with b's targets all placed: b leaves the published gone.
        s.a.placed(set(&["b"]));
        s.turn(34_000, &["a"]);
        assert!(s.published.gone.is_empty(), "{:?}", s.published);
    }

    #[test]
    fn a_drain_that_never_completes_keeps_the_member_gone_and_places_again() {
        let mut s = Steps::new();
        s.turn_placed(0, &["a", "b"], &[]);
        s.turn_placed(20_000, &["a", "b"], &[]);
        s.turn_placed(21_000, &["a"], &[]);
        // Each placing ends with some of b's targets still labelled b (a
        // write refused, say): b stays gone, the next turn places again,
        // and nobody joins meanwhile.
        for i in 0..5u64 {
            let p = s.turn_placed(31_000 + i * 1_000, &["a", "c"], &[]).unwrap();
            assert_eq!(p.gone, set(&["b"]));
            assert_eq!(
                s.published.members,
                set(&["a"]),
                "none joins while b is gone"
            );
        }
        // Once they are all placed, b leaves the gone; c joins a lease
        // after a ring with nobody gone was published.
        s.turn_placed(40_000, &["a", "c"], &["b"]);
        s.turn_placed(41_000, &["a", "c"], &[]);
        assert!(s.published.gone.is_empty());
        s.turn_placed(42_000, &["a", "c"], &[]);
        s.turn_placed(51_000, &["a", "c"], &[]);
        assert_eq!(
            s.published.members,
            set(&["a"]),
            "not quiet for a lease yet"
        );
        s.turn_placed(52_000, &["a", "c"], &[]);
        assert_eq!(s.published.members, set(&["a", "c"]));
    }

    #[test]
    fn a_flapping_member_settles_again_each_time_it_comes_back() {
        let mut s = Steps::new();
        s.turn_placed(0, &["a"], &[]);
        s.turn_placed(20_000, &["a"], &[]);
        // b appears, vanishes, appears: each return starts its settling
        // anew, so every turn while it settles places only gone targets,
        // and b does not join.
        let p = s.turn_placed(21_000, &["a", "b"], &[]).unwrap();
        assert_eq!(p.pass, Pass::Gone);
        let p = s.turn_placed(22_000, &["a"], &[]).unwrap();
        assert_eq!(p.pass, Pass::New, "nobody settling while b is away");
        for ms in [22_500, 24_000] {
            let p = s.turn_placed(ms, &["a", "b"], &[]).unwrap();
            assert_eq!(p.pass, Pass::Gone, "at {ms}");
            assert_eq!(s.published.members, set(&["a"]), "b has not joined at {ms}");
        }
        // Seen for the settling time since it came back: it joins, a
        // lease after the ring stopped deciding for unplaced targets.
        s.turn_placed(24_500, &["a", "b"], &[]);
        assert_eq!(s.published.members, set(&["a"]));
        s.turn_placed(34_500, &["a", "b"], &[]);
        assert_eq!(s.published.members, set(&["a", "b"]));
    }

    #[test]
    fn an_assigner_that_loses_the_lease_forgets_its_ring_and_places_all_when_back() {
        let mut s = Steps::new();
        s.turn_placed(0, &["a", "b"], &[]);
        let p = s.turn_placed(20_000, &["a", "b"], &[]).unwrap();
        assert_eq!(p.pass, Pass::Full);
        assert_eq!(
            s.turn_placed(21_000, &["a", "b"], &[]).unwrap().pass,
            Pass::New
        );
        // During a handover another replica assigns: this one publishes
        // nothing and places nothing.
        let now = s.t0 + Duration::from_millis(22_000);
        assert!(
            s.a.look(&set(&["a", "b"]), &s.published, false, now)
                .is_none()
        );
        assert!(s.a.last.is_none());
        // The other may have placed by another ring meanwhile: back as the
        // assigner, this one looks at every target again.
        assert_eq!(
            s.turn_placed(30_000, &["a", "b"], &[]).unwrap().pass,
            Pass::Full
        );
    }

    #[test]
    fn nobody_in_the_ring_places_nothing() {
        let mut s = Steps::new();
        assert!(s.turn_placed(0, &[], &[]).is_none());
        assert!(s.a.last.is_none() && !s.a.placing);
    }

    #[test]
    fn a_target_is_placed_moved_by_handshake_or_taken_from_the_gone() {
        let kind = KindRef::new("example.com/v1", "Widget");
        let ring = Ring::new(["a", "b"]);
        let want = ring
            .owner(&key("example.com", "Widget", "shop", "w"))
            .unwrap()
            .to_string();
        let other = if want == "a" { "b" } else { "a" };
        let live: BTreeSet<String> = ["a", "b", "back"].map(String::from).into();
        // Unplaced: placed.
        let p = placement(&kind, &meta("w", &[]), &ring, &live).unwrap();
        assert_eq!(p["metadata"]["labels"][SHARD_LABEL], want.as_str());
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        // In place: nothing.
        assert!(placement(&kind, &meta("w", &[(SHARD_LABEL, &want)]), &ring, &live).is_none());
        // With another live member: asked to drain, once.
        let p = placement(&kind, &meta("w", &[(SHARD_LABEL, other)]), &ring, &live).unwrap();
        assert_eq!(p["metadata"]["labels"], json!({DRAIN_LABEL: "true"}));
        assert!(
            placement(
                &kind,
                &meta("w", &[(SHARD_LABEL, other), (DRAIN_LABEL, "true")]),
                &ring,
                &live
            )
            .is_none()
        );
        // With a member that is gone: taken at once.
        let p = placement(
            &kind,
            &meta("w", &[(SHARD_LABEL, "gone"), (DRAIN_LABEL, "true")]),
            &ring,
            &live,
        )
        .unwrap();
        assert_eq!(p["metadata"]["labels"][SHARD_LABEL], want.as_str());
        assert!(p["metadata"]["labels"][DRAIN_LABEL].is_null());
        let marks = p["metadata"]["annotations"].as_object().unwrap();
        assert!(marks[PLACED_ANNOTATION].is_null(), "the mark is taken off");
        // With a member live again but not in the ring (one counted gone
        // that came back): it lets the target go first.
        let p = placement(&kind, &meta("w", &[(SHARD_LABEL, "back")]), &ring, &live).unwrap();
        assert_eq!(p["metadata"]["labels"], json!({DRAIN_LABEL: "true"}));
    }

    /// Only objects a policy selects are placed: by each policy's
    /// selector, or all of the kind once one policy selects every one.
    #[test]
    fn the_unplaced_are_looked_for_by_the_policies_selectors() {
        use runbook_core::policy::{Bundle, Origin};
        let policy = |name: &str, selector: &str| {
            (
                format!("{name}.yaml"),
                format!(
                    "apiVersion: runbook.dev/v1alpha1\nkind: Policy\nmetadata: {{name: {name}}}\nspec:\n  target: {{apiVersion: v1, kind: Pod}}\n{selector}  status: {{fields: [], conditions: []}}\n  script: p.rhai\n"
                ),
            )
        };
        let set = |files: Vec<(String, String)>| {
            let mut files: std::collections::BTreeMap<String, String> = files.into_iter().collect();
            files.insert("p.rhai".into(), "fn reconcile(ctx) { [] }".into());
            let engine = runbook_core::script::ScriptEngine::default();
            let (set, errors) = runbook_core::policy::load(
                &engine,
                &[Bundle::new(Origin::Inline("t".into()), files)],
            );
            assert!(errors.is_empty(), "{errors:?}");
            set
        };
        let pod = KindRef::new("v1", "Pod");
        let web = policy("web", "  selector: {matchLabels: {app: web}}\n");
        let db = policy("db", "  selector: {matchLabels: {app: db}}\n");
        let mut both = unplaced_selectors(&set(vec![web.clone(), db]), &pod);
        both.sort();
        assert_eq!(
            both,
            ["app=db,!runbook.dev/shard", "app=web,!runbook.dev/shard"]
        );
        let all = unplaced_selectors(&set(vec![web, policy("every", "")]), &pod);
        assert_eq!(all, ["!runbook.dev/shard"]);
    }

    /// A look at the targets outlives its continue token (the API server
    /// compacted its storage between two pages): it starts again and
    /// places every target, each once.
    #[tokio::test]
    async fn a_look_whose_continue_token_expired_starts_again() {
        use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
        let sandbox = runbook_sandbox::Sandbox::default();
        let client = sandbox.client();
        let nss: Api<Namespace> = Api::all(client.clone());
        let ns = serde_json::from_value(json!({"metadata": {"name": "t"}})).unwrap();
        nss.create(&PostParams::default(), &ns).await.unwrap();
        let typed: Api<ConfigMap> = Api::namespaced(client.clone(), "t");
        for i in 0..7 {
            let cm = json!({"metadata": {"name": format!("c{i}"), "labels": {"app": "web"}}});
            let cm = serde_json::from_value(cm).unwrap();
            typed.create(&PostParams::default(), &cm).await.unwrap();
        }
        let ar = kube::core::ApiResource::erase::<ConfigMap>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(client, "t", &ar);
        let placed = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let pages = std::sync::atomic::AtomicU32::new(0);
        let selection = format!("app=web,!{SHARD_LABEL}");
        let look = Look {
            selection: &selection,
            page: 3,
            cached: false,
        };
        each_page(&api, look, |items| {
            let (typed, placed, store) = (typed.clone(), placed.clone(), sandbox.store().clone());
            let page = pages.fetch_add(1, Ordering::Relaxed);
            async move {
                for o in items {
                    let name = o.metadata.name.unwrap();
                    let patch = json!({"metadata": {"labels": {SHARD_LABEL: "a"}}});
                    typed
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .unwrap();
                    placed.lock().unwrap().push(name);
                }
                // After the first page, the storage is compacted: the
                // second page's continue token is too old.
                if page == 0 {
                    store.compact();
                }
            }
        })
        .await
        .unwrap();
        let mut placed = placed.lock().unwrap().clone();
        placed.sort();
        let want: Vec<String> = (0..7).map(|i| format!("c{i}")).collect();
        assert_eq!(placed, want, "each placed once");
        // The first page, then the look again: pages of 3 of the 4 left.
        assert_eq!(pages.load(Ordering::Relaxed), 3);
        // Nothing is left unplaced.
        let left = ListParams::default().labels(&selection);
        assert!(typed.list(&left).await.unwrap().items.is_empty());
    }

    /// A look whose token keeps expiring ends with the 410 after a few
    /// starts (the assigner's next look carries on).
    #[tokio::test]
    async fn a_look_whose_token_keeps_expiring_gives_up() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let sandbox = runbook_sandbox::Sandbox::default();
        let typed: Api<ConfigMap> = Api::namespaced(sandbox.client(), "default");
        for i in 0..7 {
            let cm =
                serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).unwrap();
            typed.create(&PostParams::default(), &cm).await.unwrap();
        }
        let ar = kube::core::ApiResource::erase::<ConfigMap>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(sandbox.client(), "default", &ar);
        let pages = std::sync::atomic::AtomicU32::new(0);
        let look = Look {
            selection: "",
            page: 2,
            cached: false,
        };
        let result = each_page(&api, look, |_| {
            let page = pages.fetch_add(1, Ordering::Relaxed);
            // A write, so that the compaction is past the list's token.
            let (typed, store) = (typed.clone(), sandbox.store().clone());
            async move {
                let patch = json!({"metadata": {"labels": {"seen": page.to_string()}}});
                typed
                    .patch("c0", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
                store.compact();
            }
        })
        .await;
        match result {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 410),
            other => panic!("expected the 410, got {other:?}"),
        }
        assert_eq!(pages.load(Ordering::Relaxed), RESTARTS + 1);
    }
}
