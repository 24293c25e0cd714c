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

/// Starts the watch of the given gone members' labels; `None` for none
/// (the last one's health is cleared then).
pub(crate) type StartGone = Box<dyn Fn(&BTreeSet<String>) -> Option<Watch> + Send>;

/// Whether the published ring places a gone member's target on this
/// replica (`takeover::Placement::places_here`).
pub(crate) type PlacesHere = Box<dyn Fn(&RawObject) -> bool + Send>;

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

/// The merged watch; see the module's documentation.
pub(crate) struct Shares {
    me: String,
    kind: String,
    own: Watch,
    /// Whether the own watch's first list reached the store.
    own_listed: bool,
    /// What the own watch's relist has listed so far.
    own_relist: Option<HashSet<Key>>,
    gone: Option<Watch>,
    /// The gone members the gone watch selects.
    gone_labels: BTreeSet<String>,
    /// What the gone watch's list has listed so far.
    gone_list: Option<GoneList>,
    /// When the gone watch was last started.
    gone_started: Instant,
    start_gone: StartGone,
    /// Only the gone members' targets the ring places here are held: the
    /// others' reconciles would end at once, and at thousands of targets
    /// passing them through the store and the controller's queue is most
    /// of a takeover's time.
    places_here: PlacesHere,
    /// The gone members to watch the labels of; `None` once nothing
    /// tells of them any more.
    watched: Option<watch::Receiver<BTreeSet<String>>>,
    store: Store<RawObject>,
    resource: Arc<ApiResource>,
    out: VecDeque<WatchResult>,
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
    /// The gone members, as published.
    pub watched: watch::Receiver<BTreeSet<String>>,
    /// The kind's store, and how it is served.
    pub store: Store<RawObject>,
    pub resource: Arc<ApiResource>,
}

impl Shares {
    pub(crate) fn new(parts: Parts) -> Self {
        let Parts {
            me,
            kind,
            own,
            start_gone,
            places_here,
            watched,
            store,
            resource,
        } = parts;
        Self {
            me,
            kind,
            own,
            own_listed: false,
            own_relist: None,
            gone: None,
            gone_labels: BTreeSet::new(),
            gone_list: None,
            gone_started: Instant::now(),
            start_gone,
            places_here,
            watched: Some(watched),
            store,
            resource,
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
            let listed = self.own_listed;
            let (own, gone, watched) = (&mut self.own, &mut self.gone, &mut self.watched);
            let gone = async {
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
            enum Step {
                Own(Option<WatchResult>),
                Gone(Option<WatchResult>),
                Changed(bool),
            }
            let step = tokio::select! {
                biased;
                e = own.next() => Step::Own(e),
                ok = changed, if listed => Step::Changed(ok),
                e = gone, if listed => Step::Gone(e),
            };
            match step {
                // The own watch ending ends the controller (its supervisor
                // starts it again).
                Step::Own(None) => return None,
                Step::Own(Some(e)) => self.on_own(e),
                Step::Gone(Some(e)) => self.on_gone(e),
                // A watcher does not end; were it to, the next change of
                // the gone members starts another.
                Step::Gone(None) => self.gone = None,
                Step::Changed(true) => self.follow(),
                Step::Changed(false) => self.watched = None,
            }
        }
    }

    fn held(&self, o: &RawObject) -> Option<std::sync::Arc<RawObject>> {
        self.store.get(&o.to_object_ref(self.resource.clone()))
    }

    /// Whether the store holds this object as the own watch last said it.
    fn held_as_own(&self, o: &RawObject) -> bool {
        self.held(o).is_some_and(|h| label(&h) == Some(&self.me))
    }

    fn on_own(&mut self, e: WatchResult) {
        let e = match e {
            Ok(e) => e,
            Err(e) => return self.out.push_back(Err(e)),
        };
        if !self.own_listed {
            // The first list fills the store as any reflector's does; the
            // gone watch starts after it.
            let done = matches!(e, Event::InitDone);
            self.out.push_back(Ok(e));
            if done {
                self.own_listed = true;
                self.follow();
            }
            return;
        }
        match e {
            Event::Init => self.own_relist = Some(HashSet::new()),
            Event::InitApply(o) => {
                if let Some(seen) = self.own_relist.as_mut() {
                    seen.insert(key(&o));
                }
                self.out.push_back(Ok(Event::Apply(o)));
            }
            Event::InitDone => {
                let seen = self.own_relist.take().unwrap_or_default();
                let me = self.me.clone();
                self.sweep(|o| label(o) == Some(&me) && !seen.contains(&key(o)));
            }
            Event::Apply(o) => self.out.push_back(Ok(Event::Apply(o))),
            // Held as a gone member's target (the object went from this
            // replica's label to a gone member's, and the gone watch said
            // so first): the gone watch's word stands.
            Event::Delete(o) => match self.held(&o) {
                Some(h) if label(&h) != Some(&self.me) => {}
                _ => self.out.push_back(Ok(Event::Delete(o))),
            },
        }
    }

    fn on_gone(&mut self, e: WatchResult) {
        // Its failures are reported and retried with a backoff where the
        // watch is made (`StartGone`); the controller never sees them.
        let Ok(e) = e else { return };
        match e {
            Event::Init => {
                self.gone_list = Some(GoneList {
                    seen: HashSet::new(),
                    listed: 0,
                    began: Instant::now(),
                    first: None,
                })
            }
            Event::InitApply(o) => {
                let here = (self.places_here)(&o);
                if let Some(list) = self.gone_list.as_mut() {
                    list.first.get_or_insert_with(|| list.began.elapsed());
                    list.listed += 1;
                    if list.listed % 500 == 0 {
                        tracing::debug!(
                            kind = %self.kind,
                            listed = list.listed,
                            held = list.seen.len(),
                            ms = list.began.elapsed().as_millis() as u64,
                            "listing the gone members' targets"
                        );
                    }
                    // Those placed elsewhere are not held: the sweep at
                    // the list's end drops any held from before.
                    if here {
                        list.seen.insert(key(&o));
                    }
                }
                if !here {
                    return;
                }
                // Held as the own watch said it, or already held as it
                // is (the gone members changed, and this one's targets
                // are listed again): nothing new to decide.
                let skip = self.held(&o).is_some_and(|h| {
                    label(&h) == Some(&self.me)
                        || h.meta.resource_version == o.meta.resource_version
                });
                if !skip {
                    self.out.push_back(Ok(Event::Apply(o)));
                }
            }
            Event::InitDone => {
                let Some(list) = self.gone_list.take() else {
                    return;
                };
                let me = self.me.clone();
                let seen = &list.seen;
                self.sweep(|o| label(o) != Some(&me) && !seen.contains(&key(o)));
                // From the watch's start to its list's request, to the
                // list's first object, and to its end.
                let ms = |d: std::time::Duration| d.as_millis() as u64;
                tracing::info!(
                    kind = %self.kind,
                    gone = ?self.gone_labels,
                    listed = list.listed,
                    targets = seen.len(),
                    requested_ms = ms(list.began.saturating_duration_since(self.gone_started)),
                    first_ms = list.first.map(ms),
                    ms = ms(list.began.elapsed()),
                    "listed the gone members' targets"
                );
            }
            // The own watch's word stands for an object it holds.
            Event::Apply(o) | Event::Delete(o) if self.held_as_own(&o) => {}
            // Placed on another replica: not held here (dropped, were it
            // held from before).
            Event::Apply(o) if !(self.places_here)(&o) => {
                if self.held(&o).is_some() {
                    self.out.push_back(Ok(Event::Delete(o)));
                }
            }
            Event::Delete(o) if self.held(&o).is_none() => {}
            e => self.out.push_back(Ok(e)),
        }
    }

    /// The gone members changed: watch theirs instead.
    fn follow(&mut self) {
        let Some(watched) = self.watched.as_mut() else {
            return;
        };
        let labels = watched.borrow_and_update().clone();
        if labels == self.gone_labels && (self.gone.is_some() || labels.is_empty()) {
            return;
        }
        self.gone_list = None;
        self.gone_started = Instant::now();
        self.gone = (self.start_gone)(&labels);
        self.gone_labels = labels;
        if self.gone.is_none() {
            // Nobody's targets but this replica's own any more.
            let me = self.me.clone();
            self.sweep(|o| label(o) != Some(&me));
        }
    }

    /// Pass on the deletion of every object held that `gone` picks.
    fn sweep(&mut self, gone: impl Fn(&RawObject) -> bool) {
        for o in self.store.state_filter(gone) {
            self.out.push_back(Ok(Event::Delete((*o).clone())));
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
    type Started = Arc<Mutex<Vec<(BTreeSet<String>, Sender)>>>;

    /// The merged watch, with its store and what it passed on, driven by
    /// hand: the own watch and each gone watch started are channels.
    struct Rig {
        own: Sender,
        gone: Started,
        /// The gone members' targets the ring places on other replicas,
        /// by name.
        elsewhere: Arc<Mutex<BTreeSet<String>>>,
        watched: watch::Sender<BTreeSet<String>>,
        store: Store<RawObject>,
        events: BoxStream<'static, WatchResult>,
        passed: Vec<String>,
    }

    impl Rig {
        fn new() -> Self {
            let (own, own_rx) = mpsc::unbounded();
            let gone = Arc::new(Mutex::new(Vec::new()));
            let started = gone.clone();
            let start: StartGone = Box::new(move |labels: &BTreeSet<String>| {
                if labels.is_empty() {
                    return None;
                }
                let (tx, rx) = mpsc::unbounded();
                started.lock().unwrap().push((labels.clone(), tx));
                Some(rx.boxed())
            });
            let (watched, watched_rx) = watch::channel(BTreeSet::new());
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

        fn started(&self) -> Vec<BTreeSet<String>> {
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

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[tokio::test]
    async fn a_gone_members_targets_join_the_own_share_without_listing_it_again() {
        let mut rig = Rig::new();
        // Gone members known before the own list is done wait for it.
        rig.watched.send(set(&["g"])).unwrap();
        rig.own(vec![Event::Init, Event::InitApply(object("a", "me", "1"))]);
        rig.settle().await;
        assert!(rig.started().is_empty());
        rig.own(vec![
            Event::InitApply(object("b", "me", "1")),
            Event::InitDone,
        ]);
        rig.settle().await;
        assert_eq!(rig.passed(), ["init", "listed a", "listed b", "done"]);
        assert_eq!(rig.started(), [set(&["g"])]);
        rig.gone(list(&[("c", "g"), ("d", "g")]));
        rig.settle().await;
        // Only the gone member's targets are decided, and the own stay.
        assert_eq!(rig.passed(), ["apply c", "apply d"]);
        assert_eq!(rig.held(), ["a:me", "b:me", "c:g", "d:g"]);
    }

    #[tokio::test]
    async fn an_object_moving_to_the_own_label_is_kept_whichever_watch_tells_first() {
        let mut rig = Rig::new();
        rig.watched.send(set(&["g"])).unwrap();
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
        rig.watched.send(set(&["g"])).unwrap();
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
        rig.watched.send(set(&["g"])).unwrap();
        rig.settle().await;
        rig.gone(list(&[("c", "g")]));
        rig.settle().await;
        rig.passed();
        // Another member gone: both are listed, and only the new one's
        // targets are decided.
        rig.watched.send(set(&["g", "h"])).unwrap();
        rig.settle().await;
        assert_eq!(rig.started(), [set(&["g"]), set(&["g", "h"])]);
        rig.gone(list(&[("c", "g"), ("e", "h")]));
        rig.settle().await;
        assert_eq!(rig.passed(), ["apply e"]);
        // g's targets are all placed elsewhere now: only h's are listed.
        rig.watched.send(set(&["h"])).unwrap();
        rig.settle().await;
        rig.gone(list(&[("e", "h")]));
        rig.settle().await;
        assert_eq!(rig.passed(), ["delete c"]);
        // Nobody gone: only the own share is held.
        rig.watched.send(BTreeSet::new()).unwrap();
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
        rig.watched.send(set(&["g"])).unwrap();
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
        rig.watched.send(set(&["g", "h"])).unwrap();
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
