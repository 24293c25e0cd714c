//! One watch over several namespaces: a kind that only tenants' policies
//! declare is watched in each tenant's namespace alone (the operator may
//! hold no right to it elsewhere), and the watches feed one cache, as one
//! stream with the events of a single watch.
//!
//! The first lists of all the watches are one list (one `Init`, each
//! watch's objects, one `InitDone` once every watch has listed), so the
//! cache is filled once every namespace is. A later relist of one watch
//! (after an error, or a 410) must not replace what the others hold: it is
//! passed on as an `Apply` of each object it lists and a `Delete` of each
//! object of its namespace it no longer lists. A watch's events that come
//! while the others still make their first list wait until it is done.

use std::collections::{HashMap, HashSet, VecDeque};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};

use runbook_core::observe::RawObject;

pub type WatchResult = Result<Event<RawObject>, watcher::Error>;

/// One watch's part.
#[derive(Default)]
struct Part {
    /// Its first list reached the merged stream.
    listed: bool,
    /// What a relist under way has listed so far.
    relist: Option<HashSet<String>>,
    /// What it holds now, by name (a clone shares the object).
    known: HashMap<String, RawObject>,
}

struct Merge {
    parts: Vec<Part>,
    /// The watches whose first list is not done yet.
    first_pending: usize,
    /// Whether the merged `Init` went out.
    started: bool,
    /// Events of watches that listed, waiting for the others' first list.
    held: VecDeque<(usize, WatchResult)>,
    out: VecDeque<WatchResult>,
}

impl Merge {
    fn take(&mut self, i: usize, event: WatchResult) {
        let Ok(event) = event else {
            self.out.push_back(event);
            return;
        };
        if self.first_pending > 0 && self.parts[i].listed {
            self.held.push_back((i, Ok(event)));
            return;
        }
        let part = &mut self.parts[i];
        match event {
            Event::Init if !part.listed => {
                if !self.started {
                    self.started = true;
                    self.out.push_back(Ok(Event::Init));
                }
            }
            Event::Init => part.relist = Some(HashSet::new()),
            Event::InitApply(o) if !part.listed => {
                part.known.insert(o.name().to_string(), o.clone());
                self.out.push_back(Ok(Event::InitApply(o)));
            }
            Event::InitApply(o) => {
                if let Some(seen) = part.relist.as_mut() {
                    seen.insert(o.name().to_string());
                }
                part.known.insert(o.name().to_string(), o.clone());
                self.out.push_back(Ok(Event::Apply(o)));
            }
            Event::InitDone if !part.listed => {
                part.listed = true;
                self.first_pending -= 1;
                if self.first_pending == 0 {
                    self.out.push_back(Ok(Event::InitDone));
                    while let Some((j, e)) = self.held.pop_front() {
                        self.take(j, e);
                    }
                }
            }
            Event::InitDone => {
                let seen = part.relist.take().unwrap_or_default();
                let gone: Vec<String> = part
                    .known
                    .keys()
                    .filter(|n| !seen.contains(*n))
                    .cloned()
                    .collect();
                for name in gone {
                    if let Some(o) = part.known.remove(&name) {
                        self.out.push_back(Ok(Event::Delete(o)));
                    }
                }
            }
            Event::Apply(o) => {
                part.known.insert(o.name().to_string(), o.clone());
                self.out.push_back(Ok(Event::Apply(o)));
            }
            Event::Delete(o) => {
                part.known.remove(o.name());
                self.out.push_back(Ok(Event::Delete(o)));
            }
        }
    }
}

/// The watches as one stream (one watch is passed on as it is).
pub fn merged<S>(mut watches: Vec<S>) -> BoxStream<'static, WatchResult>
where
    S: Stream<Item = WatchResult> + Send + 'static,
{
    if watches.len() == 1
        && let Some(only) = watches.pop()
    {
        return only.boxed();
    }
    let n = watches.len();
    let tagged = futures::stream::select_all(
        watches
            .into_iter()
            .enumerate()
            .map(|(i, w)| w.map(move |e| (i, e)).boxed()),
    );
    let merge = Merge {
        parts: (0..n).map(|_| Part::default()).collect(),
        first_pending: n,
        started: false,
        held: VecDeque::new(),
        out: VecDeque::new(),
    };
    futures::stream::unfold((merge, tagged), |(mut merge, mut tagged)| async move {
        loop {
            if let Some(e) = merge.out.pop_front() {
                return Some((e, (merge, tagged)));
            }
            let (i, e) = tagged.next().await?;
            merge.take(i, e);
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(ns: &str, name: &str) -> RawObject {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": ns, "name": name, "resourceVersion": "1"}
        }))
        .unwrap()
    }

    fn said(e: &WatchResult) -> String {
        match e {
            Ok(Event::Init) => "init".into(),
            Ok(Event::InitApply(o)) => format!("list {}/{}", o.namespace(), o.name()),
            Ok(Event::InitDone) => "listed".into(),
            Ok(Event::Apply(o)) => format!("apply {}/{}", o.namespace(), o.name()),
            Ok(Event::Delete(o)) => format!("delete {}/{}", o.namespace(), o.name()),
            Err(e) => format!("error {e}"),
        }
    }

    async fn run(a: Vec<WatchResult>, b: Vec<WatchResult>) -> Vec<String> {
        let (a, b) = (futures::stream::iter(a), futures::stream::iter(b));
        merged(vec![a.boxed(), b.boxed()])
            .map(|e| said(&e))
            .collect()
            .await
    }

    #[tokio::test]
    async fn one_list_for_all_namespaces_and_a_relist_of_one_touches_only_its_own() {
        let a = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(obj("a", "x"))),
            Ok(Event::InitDone),
            // Its relist, before b has listed: held until b has.
            Ok(Event::Init),
            Ok(Event::InitApply(obj("a", "y"))),
            Ok(Event::InitDone),
        ];
        let b = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(obj("b", "z"))),
            Ok(Event::InitDone),
            Ok(Event::Delete(obj("b", "z"))),
        ];
        let out = run(a, b).await;
        let pos = |s: &str| out.iter().position(|x| x == s).unwrap_or(usize::MAX);
        assert_eq!(out.iter().filter(|s| *s == "init").count(), 1, "{out:?}");
        assert_eq!(out.iter().filter(|s| *s == "listed").count(), 1, "{out:?}");
        assert!(pos("list a/x") < pos("listed"), "{out:?}");
        assert!(pos("list b/z") < pos("listed"), "{out:?}");
        // a's relist: y applied, x gone, both after the one list.
        assert!(pos("listed") < pos("apply a/y"), "{out:?}");
        assert!(pos("apply a/y") < pos("delete a/x"), "{out:?}");
        assert!(out.contains(&"delete b/z".to_string()), "{out:?}");
        assert!(!out.iter().any(|s| s == "delete b/x" || s == "delete a/z"));
    }
}
