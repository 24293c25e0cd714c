//! A sharded replica's watch of a target kind: its own label, and beside
//! it the labels of the members gone whose targets it may decide for
//! (`takeover`), both feeding the one store of the kind's controller.
//!
//! The own watch runs as long as the controller. The gone watch is started
//! again whenever the set of gone members changes, and lists only their
//! targets: taking over neither lists nor decides this replica's own share
//! again, as a controller started again with a wider selector would.
//!
//! The reflector's store holds what either watch last said. A relist
//! replaces the whole store, which would drop the other watch's objects,
//! so after the first list each watch's relist is passed on as applies
//! and the deletions it implies. An object moving from a gone label to
//! this replica's own shows up in both watches, in either order; the
//! store keeps what the own watch says of it.
//!
//! `Merge` holds these rules as a plain state machine, stepped one input
//! at a time with what the store holds and the time; `Shares` is the loop
//! that reads the watches, steps it and starts the watches it asks for.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::core::ApiResource;
use kube::runtime::reflector::{Lookup, Store};
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::time::Instant;

use runbook_core::observe::RawObject;
use runbook_core::shard::SHARD_LABEL;

pub(crate) type WatchResult = Result<Event<RawObject>, watcher::Error>;
pub(crate) type Watch = BoxStream<'static, WatchResult>;

/// Starts the watch beside the own one (see [`Unheld`]); `None` for none
/// (the last one's health is cleared then).
pub(crate) type StartGone = Box<dyn Fn(&Unheld) -> Option<Watch> + Send>;

/// Whether the published ring places a gone member's target on this
/// replica (`takeover::Placement::places_here`).
pub(crate) type PlacesHere = Box<dyn Fn(&RawObject) -> bool + Send>;

/// What the watch beside a replica's own selects: the targets of the gone
/// members whose children its caches hold, or, while the published ring
/// decides for unplaced targets (`takeover`), every target labelled for
/// none of the ring's members (unplaced ones, and any gone member's).
/// Of those, the store holds the ones the ring places here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unheld {
    /// The gone members whose targets this replica may decide for.
    pub gone: BTreeSet<String>,
    /// The ring's members, while it decides for unplaced targets and
    /// this replica is among them.
    pub ring: Option<BTreeSet<String>>,
}

impl Unheld {
    /// Gone members' targets only.
    pub fn gone(gone: BTreeSet<String>) -> Self {
        Self { gone, ring: None }
    }

    /// Whether nothing is watched beside the own watch.
    pub fn is_empty(&self) -> bool {
        self.ring.is_none() && self.gone.is_empty()
    }

    /// The label selection of the watch (without the policies' own);
    /// `None` for none.
    pub fn selection(&self) -> Option<String> {
        match &self.ring {
            Some(members) => Some(shard_label(members, false)),
            None if self.gone.is_empty() => None,
            None => Some(shard_label(&self.gone, true)),
        }
    }
}

/// The selector of the targets labelled for any of `labels` (`within`),
/// or for none of them (unlabelled ones included).
pub(super) fn shard_label(labels: &BTreeSet<String>, within: bool) -> String {
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let op = if within { "in" } else { "notin" };
    format!("{SHARD_LABEL} {op} ({})", labels.join(","))
}

/// Where an object is held in the store from: the shard label it carries.
fn label(o: &RawObject) -> Option<&str> {
    o.label(SHARD_LABEL)
}

type Key = (Option<String>, String);

fn key(o: &RawObject) -> Key {
    (
        o.meta.namespace.clone(),
        o.meta.name.clone().unwrap_or_default(),
    )
}

/// The gone watch's list under way: what it listed so far, when it was
/// requested, and how long its first object took.
struct GoneList {
    /// Those the ring places here.
    seen: HashSet<Key>,
    listed: usize,
    began: Instant,
    first: Option<std::time::Duration>,
}

/// What the merge looks at as it steps: the store as the reflector holds
/// it, and where the published ring places a gone member's target.
pub(crate) trait Look {
    /// The object as the store holds it.
    fn held(&self, o: &RawObject) -> Option<Arc<RawObject>>;
    /// Every object held that `pick` picks.
    fn held_where(&self, pick: &dyn Fn(&RawObject) -> bool) -> Vec<Arc<RawObject>>;
    /// Whether the published ring places this gone member's target here.
    fn places_here(&self, o: &RawObject) -> bool;
}

/// What the merge is told, one thing at a time.
pub(crate) enum Input {
    /// An event of the own watch.
    Own(WatchResult),
    /// An event of the gone watch.
    Gone(WatchResult),
    /// The gone watch ended (a watcher does not; were it to, the next
    /// change of the gone members starts another).
    GoneEnded,
    /// The watch beside the own one selects this now.
    Watched(Unheld),
}

/// What a step asks of its loop.
pub(crate) enum Act {
    /// Pass this on to the reflector.
    Pass(WatchResult),
    /// Watch these targets, in place of the ones watched (none: stop).
    Watch(Unheld),
}

/// The merge of the own watch and the gone watch as a plain state machine:
/// [`Merge::step`] takes one input, what the store holds and the time, and
/// says what to pass on and which watch to start. See the module's
/// documentation for the rules.
pub(crate) struct Merge {
    me: String,
    kind: String,
    /// Whether the own watch's first list reached the store.
    own_listed: bool,
    /// What the own watch's relist has listed so far.
    own_relist: Option<HashSet<Key>>,
    /// The gone members to watch, as last told.
    wanted: Unheld,
    /// The gone members the gone watch selects, and whether it runs.
    gone_labels: Unheld,
    gone_running: bool,
    /// What the gone watch's list has listed so far.
    gone_list: Option<GoneList>,
    /// When the gone watch was last started.
    gone_started: Instant,
    out: Vec<Act>,
}

impl Merge {
    /// A merge for replica `me`, told of the gone members `wanted` so far.
    pub(crate) fn new(me: String, kind: String, wanted: Unheld, now: Instant) -> Self {
        Self {
            me,
            kind,
            own_listed: false,
            own_relist: None,
            wanted,
            gone_labels: Unheld::default(),
            gone_running: false,
            gone_list: None,
            gone_started: now,
            out: Vec::new(),
        }
    }

    /// Whether the own watch's first list is done: the gone watch and its
    /// changes wait for it.
    pub(crate) fn listed(&self) -> bool {
        self.own_listed
    }

    /// Take one input: what to do, in order.
    pub(crate) fn step(&mut self, input: Input, look: &dyn Look, now: Instant) -> Vec<Act> {
        match input {
            Input::Own(e) => self.on_own(e, look, now),
            Input::Gone(e) => self.on_gone(e, look, now),
            Input::GoneEnded => self.gone_running = false,
            Input::Watched(labels) => {
                self.wanted = labels;
                if self.own_listed {
                    self.follow(look, now);
                }
            }
        }
        std::mem::take(&mut self.out)
    }

    fn pass(&mut self, e: Event<RawObject>) {
        self.out.push(Act::Pass(Ok(e)));
    }

    /// Whether the store holds this object as the own watch last said it.
    fn held_as_own(&self, o: &RawObject, look: &dyn Look) -> bool {
        look.held(o).is_some_and(|h| label(&h) == Some(&self.me))
    }

    fn on_own(&mut self, e: WatchResult, look: &dyn Look, now: Instant) {
        let e = match e {
            Ok(e) => e,
            Err(e) => return self.out.push(Act::Pass(Err(e))),
        };
        if !self.own_listed {
            // The first list fills the store as any reflector's does; the
            // gone watch starts after it.
            let done = matches!(e, Event::InitDone);
            self.pass(e);
            if done {
                self.own_listed = true;
                self.follow(look, now);
            }
            return;
        }
        match e {
            Event::Init => self.own_relist = Some(HashSet::new()),
            Event::InitApply(o) => {
                if let Some(seen) = self.own_relist.as_mut() {
                    seen.insert(key(&o));
                }
                self.pass(Event::Apply(o));
            }
            Event::InitDone => {
                let seen = self.own_relist.take().unwrap_or_default();
                let me = self.me.clone();
                self.sweep(look, &|o| label(o) == Some(&me) && !seen.contains(&key(o)));
            }
            Event::Apply(o) => self.pass(Event::Apply(o)),
            // Held as a gone member's target (the object went from this
            // replica's label to a gone member's, and the gone watch said
            // so first): the gone watch's word stands.
            Event::Delete(o) => match look.held(&o) {
                Some(h) if label(&h) != Some(&self.me) => {}
                _ => self.pass(Event::Delete(o)),
            },
        }
    }

    fn on_gone(&mut self, e: WatchResult, look: &dyn Look, now: Instant) {
        // Its failures are reported and retried with a backoff where the
        // watch is made (`StartGone`); the controller never sees them.
        let Ok(e) = e else { return };
        match e {
            Event::Init => {
                self.gone_list = Some(GoneList {
                    seen: HashSet::new(),
                    listed: 0,
                    began: now,
                    first: None,
                })
            }
            Event::InitApply(o) => self.gone_listed(o, look, now),
            Event::InitDone => self.gone_list_done(look, now),
            // The own watch's word stands for an object it holds.
            Event::Apply(o) | Event::Delete(o) if self.held_as_own(&o, look) => {}
            // Placed on another replica: not held here (dropped, were it
            // held from before).
            Event::Apply(o) if !look.places_here(&o) => {
                if look.held(&o).is_some() {
                    self.pass(Event::Delete(o));
                }
            }
            Event::Delete(o) if look.held(&o).is_none() => {}
            e => self.pass(e),
        }
    }

    /// One object of the gone watch's list.
    fn gone_listed(&mut self, o: RawObject, look: &dyn Look, now: Instant) {
        let here = look.places_here(&o);
        if let Some(list) = self.gone_list.as_mut() {
            list.first
                .get_or_insert_with(|| now.saturating_duration_since(list.began));
            list.listed += 1;
            if list.listed % 500 == 0 {
                tracing::debug!(
                    kind = %self.kind,
                    listed = list.listed,
                    held = list.seen.len(),
                    ms = now.saturating_duration_since(list.began).as_millis() as u64,
                    "listing the gone members' targets"
                );
            }
            // Those placed elsewhere are not held: the sweep at the list's
            // end drops any held from before.
            if here {
                list.seen.insert(key(&o));
            }
        }
        if !here {
            return;
        }
        // Held as the own watch said it, or already held as it is (the gone
        // members changed, and this one's targets are listed again):
        // nothing new to decide.
        let skip = look.held(&o).is_some_and(|h| {
            label(&h) == Some(&self.me) || h.meta.resource_version == o.meta.resource_version
        });
        if !skip {
            self.pass(Event::Apply(o));
        }
    }

    /// The gone watch's list is done: what it no longer lists goes.
    fn gone_list_done(&mut self, look: &dyn Look, now: Instant) {
        let Some(list) = self.gone_list.take() else {
            return;
        };
        let me = self.me.clone();
        let seen = &list.seen;
        self.sweep(look, &|o| label(o) != Some(&me) && !seen.contains(&key(o)));
        // From the watch's start to its list's request, to the list's
        // first object, and to its end.
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        tracing::info!(
            kind = %self.kind,
            gone = ?self.gone_labels,
            listed = list.listed,
            targets = seen.len(),
            requested_ms = ms(list.began.saturating_duration_since(self.gone_started)),
            first_ms = list.first.map(ms),
            ms = ms(now.saturating_duration_since(list.began)),
            "listed the gone members' targets"
        );
    }

    /// Watch the gone members wanted, where they are not the ones watched.
    fn follow(&mut self, look: &dyn Look, now: Instant) {
        let labels = self.wanted.clone();
        if labels == self.gone_labels && (self.gone_running || labels.is_empty()) {
            return;
        }
        self.gone_list = None;
        self.gone_started = now;
        self.gone_running = !labels.is_empty();
        self.gone_labels = labels.clone();
        self.out.push(Act::Watch(labels));
        if !self.gone_running {
            // Nobody's targets but this replica's own any more.
            let me = self.me.clone();
            self.sweep(look, &|o| label(o) != Some(&me));
        }
    }

    /// Pass on the deletion of every object held that `gone` picks.
    fn sweep(&mut self, look: &dyn Look, gone: &dyn Fn(&RawObject) -> bool) {
        for o in look.held_where(gone) {
            self.pass(Event::Delete((*o).clone()));
        }
    }
}

/// What a sharded replica's watch of a kind is made of.
pub(crate) struct Parts {
    /// This replica's identity.
    pub me: String,
    /// The kind, for logs.
    pub kind: String,
    /// The watch of this replica's own label.
    pub own: Watch,
    /// Starts the watch of the gone members' labels.
    pub start_gone: StartGone,
    /// Whether the published ring places a gone member's target here.
    pub places_here: PlacesHere,
    /// What the watch beside the own one selects, as published.
    pub watched: watch::Receiver<Unheld>,
    /// The kind's store, and how it is served.
    pub store: Store<RawObject>,
    pub resource: Arc<ApiResource>,
}

/// The store and the ring, as the merge looks at them.
struct Held {
    store: Store<RawObject>,
    resource: Arc<ApiResource>,
    places_here: PlacesHere,
}

impl Look for Held {
    fn held(&self, o: &RawObject) -> Option<Arc<RawObject>> {
        self.store.get(&o.to_object_ref(self.resource.clone()))
    }

    fn held_where(&self, pick: &dyn Fn(&RawObject) -> bool) -> Vec<Arc<RawObject>> {
        self.store.state_filter(pick)
    }

    fn places_here(&self, o: &RawObject) -> bool {
        (self.places_here)(o)
    }
}

/// The merged watch: the I/O loop that feeds [`Merge`] and does what it
/// asks.
pub(crate) struct Shares {
    merge: Merge,
    held: Held,
    own: Watch,
    gone: Option<Watch>,
    start_gone: StartGone,
    /// The gone members to watch the labels of; `None` once nothing
    /// tells of them any more.
    watched: Option<watch::Receiver<Unheld>>,
    out: VecDeque<WatchResult>,
}

impl Shares {
    pub(crate) fn new(parts: Parts) -> Self {
        let Parts {
            me,
            kind,
            own,
            start_gone,
            places_here,
            mut watched,
            store,
            resource,
        } = parts;
        let wanted = watched.borrow_and_update().clone();
        Self {
            merge: Merge::new(me, kind, wanted, Instant::now()),
            held: Held {
                store,
                resource,
                places_here,
            },
            own,
            gone: None,
            start_gone,
            watched: Some(watched),
            out: VecDeque::new(),
        }
    }

    /// The merged events, one at a time: the reflector applies each
    /// before the next is made, so the store is looked at as it is.
    pub(crate) fn into_stream(self) -> impl Stream<Item = WatchResult> + Send + 'static {
        futures::stream::unfold(self, |mut s| async move {
            let next = s.next().await?;
            Some((next, s))
        })
    }

    async fn next(&mut self) -> Option<WatchResult> {
        loop {
            if let Some(e) = self.out.pop_front() {
                return Some(e);
            }
            let input = self.input().await?;
            for act in self.merge.step(input, &self.held, Instant::now()) {
                match act {
                    Act::Pass(e) => self.out.push_back(e),
                    Act::Watch(labels) => self.gone = (self.start_gone)(&labels),
                }
            }
        }
    }

    /// The next input; `None` when the own watch ends (which ends the
    /// controller; its supervisor starts it again).
    async fn input(&mut self) -> Option<Input> {
        loop {
            let listed = self.merge.listed();
            let (own, gone, watched) = (&mut self.own, &mut self.gone, &mut self.watched);
            let gone_next = async {
                match gone.as_mut() {
                    Some(g) => g.next().await,
                    None => std::future::pending().await,
                }
            };
            let changed = async {
                match watched.as_mut() {
                    Some(w) => w.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            enum Got {
                Own(Option<WatchResult>),
                Gone(Option<WatchResult>),
                Changed(bool),
            }
            let got = tokio::select! {
                biased;
                e = own.next() => Got::Own(e),
                ok = changed, if listed => Got::Changed(ok),
                e = gone_next, if listed => Got::Gone(e),
            };
            return match got {
                Got::Own(e) => e.map(Input::Own),
                Got::Gone(Some(e)) => Some(Input::Gone(e)),
                Got::Gone(None) => {
                    self.gone = None;
                    Some(Input::GoneEnded)
                }
                Got::Changed(true) => {
                    let labels = self.watched.as_mut().map(|w| w.borrow_and_update().clone());
                    Some(Input::Watched(labels.unwrap_or_default()))
                }
                Got::Changed(false) => {
                    self.watched = None;
                    continue;
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use kube::runtime::reflector;
    use std::sync::Mutex;

    fn resource() -> Arc<ApiResource> {
        Arc::new(ApiResource {
            group: "example.com".into(),
            version: "v1".into(),
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            plural: "widgets".into(),
        })
    }

    fn object(name: &str, shard: &str, version: &str) -> RawObject {
        RawObject::from_value(serde_json::json!({
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {
                "name": name,
                "namespace": "ns",
                "resourceVersion": version,
                "labels": {SHARD_LABEL: shard},
            },
        }))
    }

    /// A watch's whole list of `(name, shard)`, at resourceVersion 1.
    fn list(objects: &[(&str, &str)]) -> Vec<Event<RawObject>> {
        let listed = objects
            .iter()
            .map(|(name, shard)| Event::InitApply(object(name, shard, "1")));
        std::iter::once(Event::Init)
            .chain(listed)
            .chain(std::iter::once(Event::InitDone))
            .collect()
    }

    type Sender = mpsc::UnboundedSender<WatchResult>;
    /// Each gone watch started: its labels, and where its events go.
    type Started = Arc<Mutex<Vec<(Unheld, Sender)>>>;

    /// The merged watch, with its store and what it passed on, driven by
    /// hand: the own watch and each gone watch started are channels.
    struct Rig {
        own: Sender,
        gone: Started,
        /// The gone members' targets the ring places on other replicas,
        /// by name.
        elsewhere: Arc<Mutex<BTreeSet<String>>>,
        watched: watch::Sender<Unheld>,
        store: Store<RawObject>,
        events: BoxStream<'static, WatchResult>,
        passed: Vec<String>,
    }

    impl Rig {
        fn new() -> Self {
            let (own, own_rx) = mpsc::unbounded();
            let gone = Arc::new(Mutex::new(Vec::new()));
            let started = gone.clone();
            let start: StartGone = Box::new(move |labels: &Unheld| {
                if labels.is_empty() {
                    return None;
                }
                let (tx, rx) = mpsc::unbounded();
                started.lock().unwrap().push((labels.clone(), tx));
                Some(rx.boxed())
            });
            let (watched, watched_rx) = watch::channel(Unheld::default());
            let elsewhere = Arc::new(Mutex::new(BTreeSet::<String>::new()));
            let placed = elsewhere.clone();
            let places_here: PlacesHere = Box::new(move |o: &RawObject| {
                !placed
                    .lock()
                    .unwrap()
                    .contains(o.meta.name.as_deref().unwrap_or(""))
            });
            let writer = reflector::store::Writer::<RawObject>::new(resource());
            let store = writer.as_reader();
            let shares = Shares::new(Parts {
                me: "me".into(),
                kind: "Widget".into(),
                own: own_rx.boxed(),
                start_gone: start,
                places_here,
                watched: watched_rx,
                store: store.clone(),
                resource: resource(),
            });
            let events = reflector::reflector(writer, shares.into_stream()).boxed();
            Self {
                own,
                gone,
                elsewhere,
                watched,
                store,
                events,
                passed: Vec::new(),
            }
        }

        fn own(&self, events: Vec<Event<RawObject>>) {
            for e in events {
                self.own.unbounded_send(Ok(e)).unwrap();
            }
        }

        /// Send to the gone watch started last.
        fn gone(&self, events: Vec<Event<RawObject>>) {
            let gone = self.gone.lock().unwrap();
            let (_, tx) = gone.last().expect("a gone watch was started");
            for e in events {
                tx.unbounded_send(Ok(e)).unwrap();
            }
        }

        fn started(&self) -> Vec<Unheld> {
            self.gone
                .lock()
                .unwrap()
                .iter()
                .map(|(l, _)| l.clone())
                .collect()
        }

        /// Let everything sent so far through.
        async fn settle(&mut self) {
            while let Ok(Some(e)) =
                tokio::time::timeout(std::time::Duration::from_millis(50), self.events.next()).await
            {
                self.passed.push(match e.unwrap() {
                    Event::Apply(o) => format!("apply {}", o.name()),
                    Event::Delete(o) => format!("delete {}", o.name()),
                    Event::InitApply(o) => format!("listed {}", o.name()),
                    Event::Init => "init".into(),
                    Event::InitDone => "done".into(),
                });
            }
        }

        fn passed(&mut self) -> Vec<String> {
            std::mem::take(&mut self.passed)
        }

        /// The store: name and shard label of each object, sorted.
        fn held(&self) -> Vec<String> {
            let mut held: Vec<String> = self
                .store
                .state()
                .iter()
                .map(|o| format!("{}:{}", o.meta.name.clone().unwrap(), label(o).unwrap()))
                .collect();
            held.sort();
            held
        }
    }

    /// The watch beside the own one: the gone members' labels, or,
    /// while the ring decides for unplaced targets, every label but the
    /// members' (unlabelled targets included); nothing otherwise.
    #[test]
    fn the_watch_beside_the_own_one_selects_the_gone_or_the_unheld() {
        assert_eq!(Unheld::default().selection(), None);
        assert_eq!(
            gone_of(&["g", "h"]).selection().as_deref(),
            Some("runbook.dev/shard in (g,h)")
        );
        let open = Unheld {
            gone: set(&["g"]),
            ring: Some(set(&["a", "b"])),
        };
        assert_eq!(
            open.selection().as_deref(),
            Some("runbook.dev/shard notin (a,b)")
        );
    }

    fn gone_of(names: &[&str]) -> Unheld {
        Unheld::gone(set(names))
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// The store as a reflector keeps it, applied by hand, and the
    /// names the ring places elsewhere.
    #[derive(Default)]
    struct Fake {
        held: std::collections::BTreeMap<String, Arc<RawObject>>,
        elsewhere: BTreeSet<String>,
    }

    impl Look for Fake {
        fn held(&self, o: &RawObject) -> Option<Arc<RawObject>> {
            self.held.get(o.name()).cloned()
        }
        fn held_where(&self, pick: &dyn Fn(&RawObject) -> bool) -> Vec<Arc<RawObject>> {
            self.held.values().filter(|o| pick(o)).cloned().collect()
        }
        fn places_here(&self, o: &RawObject) -> bool {
            !self.elsewhere.contains(o.name())
        }
    }

    impl Fake {
        /// Step `m` with `input`, apply what it passes on, and say what it
        /// did.
        fn step(&mut self, m: &mut Merge, input: Input) -> Vec<String> {
            let acts = m.step(input, self, Instant::now());
            acts.into_iter()
                .map(|a| match a {
                    Act::Watch(labels) => format!("watch {:?}", labels.gone),
                    Act::Pass(Err(_)) => "error".into(),
                    Act::Pass(Ok(e)) => match e {
                        Event::Apply(o) | Event::InitApply(o) => {
                            let name = o.name().to_string();
                            self.held.insert(name.clone(), Arc::new(o));
                            format!("apply {name}")
                        }
                        Event::Delete(o) => {
                            self.held.remove(o.name());
                            format!("delete {}", o.name())
                        }
                        Event::Init => "init".into(),
                        Event::InitDone => "done".into(),
                    },
                })
                .collect()
        }

        fn steps(&mut self, m: &mut Merge, inputs: Vec<Input>) -> Vec<String> {
            inputs.into_iter().flat_map(|i| self.step(m, i)).collect()
        }
    }

    fn own(events: Vec<Event<RawObject>>) -> Vec<Input> {
        events.into_iter().map(|e| Input::Own(Ok(e))).collect()
    }

    fn gone(events: Vec<Event<RawObject>>) -> Vec<Input> {
        events.into_iter().map(|e| Input::Gone(Ok(e))).collect()
    }

    fn merge() -> Merge {
        Merge::new(
            "me".into(),
            "Widget".into(),
            Unheld::default(),
            Instant::now(),
        )
    }

    /// Without a cluster or a runtime: the gone watch waits for the own
    /// list, its targets join the store, and when nobody is gone any more
    /// only the own share stays.
    #[test]
    fn the_merge_starts_the_gone_watch_after_the_own_list_and_stops_it() {
        let (mut f, mut m) = (Fake::default(), merge());
        assert!(f.step(&mut m, Input::Watched(gone_of(&["g"]))).is_empty());
        let acts = f.steps(&mut m, own(list(&[("a", "me")])));
        assert_eq!(acts, ["init", "apply a", "done", "watch {\"g\"}"]);
        let acts = f.steps(&mut m, gone(list(&[("c", "g")])));
        assert_eq!(acts, ["apply c"]);
        // The same members told again start nothing.
        assert!(f.step(&mut m, Input::Watched(gone_of(&["g"]))).is_empty());
        let acts = f.step(&mut m, Input::Watched(Unheld::default()));
        assert_eq!(acts, ["watch {}", "delete c"]);
        assert_eq!(f.held.keys().collect::<Vec<_>>(), ["a"]);
    }

    /// A gone watch that ended (a watcher does not, but were it to) is
    /// started again by the next word of the gone members, even the same;
    /// its errors never reach the controller, the own watch's do.
    #[test]
    fn an_ended_gone_watch_is_started_again_and_its_errors_stay_inside() {
        let (mut f, mut m) = (Fake::default(), merge());
        f.steps(&mut m, own(list(&[])));
        f.step(&mut m, Input::Watched(gone_of(&["g"])));
        let failed = || Err(watcher::Error::NoResourceVersion);
        assert!(f.step(&mut m, Input::Gone(failed())).is_empty());
        assert_eq!(f.step(&mut m, Input::Own(failed())), ["error"]);
        assert!(f.step(&mut m, Input::GoneEnded).is_empty());
        assert_eq!(
            f.step(&mut m, Input::Watched(gone_of(&["g"]))),
            ["watch {\"g\"}"]
        );
    }

    #[tokio::test]
    async fn a_gone_members_targets_join_the_own_share_without_listing_it_again() {
        let mut rig = Rig::new();
        // Gone members known before the own list is done wait for it.
        rig.watched.send(gone_of(&["g"])).unwrap();
        rig.own(vec![Event::Init, Event::InitApply(object("a", "me", "1"))]);
        rig.settle().await;
        assert!(rig.started().is_empty());
        rig.own(vec![
            Event::InitApply(object("b", "me", "1")),
            Event::InitDone,
        ]);
        rig.settle().await;
        assert_eq!(rig.passed(), ["init", "listed a", "listed b", "done"]);
        assert_eq!(rig.started(), [gone_of(&["g"])]);
        rig.gone(list(&[("c", "g"), ("d", "g")]));
        rig.settle().await;
        // Only the gone member's targets are decided, and the own stay.
        assert_eq!(rig.passed(), ["apply c", "apply d"]);
        assert_eq!(rig.held(), ["a:me", "b:me", "c:g", "d:g"]);
    }

    #[tokio::test]
    async fn an_object_moving_to_the_own_label_is_kept_whichever_watch_tells_first() {
        let mut rig = Rig::new();
        rig.watched.send(gone_of(&["g"])).unwrap();
        rig.own(list(&[]));
        rig.settle().await;
        rig.gone(list(&[("c", "g"), ("d", "g")]));
        rig.settle().await;
        rig.passed();
        // c: labelled for this replica, the own watch first.
        rig.own(vec![Event::Apply(object("c", "me", "2"))]);
        rig.settle().await;
        rig.gone(vec![Event::Delete(object("c", "g", "2"))]);
        rig.settle().await;
        // d: the gone watch first.
        rig.gone(vec![Event::Delete(object("d", "g", "2"))]);
        rig.settle().await;
        rig.own(vec![Event::Apply(object("d", "me", "2"))]);
        rig.settle().await;
        assert_eq!(rig.passed(), ["apply c", "delete d", "apply d"]);
        assert_eq!(rig.held(), ["c:me", "d:me"]);
        // A late apply from the gone watch does not undo the move.
        rig.gone(vec![Event::Apply(object("c", "g", "1"))]);
        rig.settle().await;
        assert_eq!(rig.held(), ["c:me", "d:me"]);
    }

    #[tokio::test]
    async fn relists_drop_only_what_their_own_watch_no_longer_lists() {
        let mut rig = Rig::new();
        rig.watched.send(gone_of(&["g"])).unwrap();
        rig.own(list(&[("a", "me"), ("b", "me")]));
        rig.settle().await;
        rig.gone(list(&[("c", "g"), ("d", "g")]));
        rig.settle().await;
        rig.passed();
        // The own watch lists again: b went while it was away.
        rig.own(list(&[("a", "me")]));
        rig.settle().await;
        assert_eq!(rig.passed(), ["apply a", "delete b"]);
        assert_eq!(rig.held(), ["a:me", "c:g", "d:g"]);
        // So does the gone one: d went.
        rig.gone(list(&[("c", "g")]));
        rig.settle().await;
        assert_eq!(rig.passed(), ["delete d"]);
        assert_eq!(rig.held(), ["a:me", "c:g"]);
    }

    #[tokio::test]
    async fn the_gone_watch_follows_the_gone_members() {
        let mut rig = Rig::new();
        rig.own(list(&[("a", "me")]));
        rig.settle().await;
        assert!(rig.started().is_empty());
        rig.watched.send(gone_of(&["g"])).unwrap();
        rig.settle().await;
        rig.gone(list(&[("c", "g")]));
        rig.settle().await;
        rig.passed();
        // Another member gone: both are listed, and only the new one's
        // targets are decided.
        rig.watched.send(gone_of(&["g", "h"])).unwrap();
        rig.settle().await;
        assert_eq!(rig.started(), [gone_of(&["g"]), gone_of(&["g", "h"])]);
        rig.gone(list(&[("c", "g"), ("e", "h")]));
        rig.settle().await;
        assert_eq!(rig.passed(), ["apply e"]);
        // g's targets are all placed elsewhere now: only h's are listed.
        rig.watched.send(gone_of(&["h"])).unwrap();
        rig.settle().await;
        rig.gone(list(&[("e", "h")]));
        rig.settle().await;
        assert_eq!(rig.passed(), ["delete c"]);
        // Nobody gone: only the own share is held.
        rig.watched.send(Unheld::default()).unwrap();
        rig.settle().await;
        assert_eq!(rig.passed(), ["delete e"]);
        assert_eq!(rig.held(), ["a:me"]);
    }

    #[tokio::test]
    async fn only_the_gone_members_targets_placed_here_are_held() {
        let mut rig = Rig::new();
        rig.own(list(&[("a", "me")]));
        rig.settle().await;
        rig.passed();
        rig.elsewhere.lock().unwrap().insert("d".into());
        rig.watched.send(gone_of(&["g"])).unwrap();
        rig.settle().await;
        rig.gone(list(&[("c", "g"), ("d", "g")]));
        rig.settle().await;
        // d is another replica's to decide for: neither held nor passed on.
        assert_eq!(rig.passed(), ["apply c"]);
        assert_eq!(rig.held(), ["a:me", "c:g"]);
        // Its changes and its relabelling pass by too.
        rig.gone(vec![
            Event::Apply(object("d", "g", "2")),
            Event::Delete(object("d", "other", "3")),
        ]);
        rig.settle().await;
        assert!(rig.passed().is_empty());
        // Another member gone moves c elsewhere on the new ring: the
        // relist drops it, and takes in d, placed here now.
        rig.elsewhere.lock().unwrap().clear();
        rig.elsewhere.lock().unwrap().insert("c".into());
        rig.watched.send(gone_of(&["g", "h"])).unwrap();
        rig.settle().await;
        rig.gone(list(&[("c", "g"), ("d", "g")]));
        rig.settle().await;
        assert_eq!(rig.passed(), ["apply d", "delete c"]);
        assert_eq!(rig.held(), ["a:me", "d:g"]);
        // A change of one held but placed elsewhere now drops it.
        rig.elsewhere.lock().unwrap().insert("d".into());
        rig.gone(vec![Event::Apply(object("d", "g", "4"))]);
        rig.settle().await;
        assert_eq!(rig.passed(), ["delete d"]);
        assert_eq!(rig.held(), ["a:me"]);
    }
}
