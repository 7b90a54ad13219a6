//! A cache of compact records in place of whole objects: a reflector whose writer maps
//! each object to a small record (or to nothing) as it arrives. Used for the kinds with
//! one object per Service (Services, Endpoints, EndpointSlices), which are most of the
//! controller's memory at scale.
//!
//! Same semantics as kube-runtime's reflector store: a (re)list fills a buffer that
//! replaces the contents once complete, so readers never see a half-listed cache, and
//! [`Records::wait_until_ready`] resolves after the first complete list.
//!
//! The keys' namespaces are shared strings, one per namespace, and a record that replaces
//! another may take over its shared parts ([`Record::share`]): at 10,000 Services, a
//! Service's key, uid and view copied again on every write of ours were megabytes.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, RwLock};

use aliaslb_core::plan::ServiceKey;
use kube::Resource;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

/// Read handle: cheap to clone, every clone sees the same contents.
pub struct Records<T> {
    map: Arc<RwLock<HashMap<ServiceKey, Arc<T>>>>,
    ready: watch::Receiver<bool>,
}

impl<T> Clone for Records<T> {
    fn clone(&self) -> Self {
        Records {
            map: self.map.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<T> fmt::Debug for Records<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Records").field("len", &self.len()).finish()
    }
}

/// The dropped writer: the cache will never be ready.
#[derive(Debug, Clone, Copy)]
pub struct WriterDropped;

impl<T> Records<T> {
    /// Every record, in no particular order.
    pub fn snapshot(&self) -> Vec<Arc<T>> {
        self.read().values().cloned().collect()
    }

    /// The record of `key`, if any.
    pub fn get(&self, key: &ServiceKey) -> Option<Arc<T>> {
        self.read().get(key).cloned()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether there is no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once the first list is complete.
    pub async fn wait_until_ready(&self) -> Result<(), WriterDropped> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|r| *r)
            .await
            .map(|_| ())
            .map_err(|_| WriterDropped)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<ServiceKey, Arc<T>>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// The string of `set` equal to `s`, added if missing: one shared copy of a string many
/// records hold (a namespace, a pool's name).
pub fn interned(set: &mut HashSet<Arc<str>>, s: &str) -> Arc<str> {
    if let Some(shared) = set.get(s) {
        return shared.clone();
    }
    let shared: Arc<str> = s.into();
    set.insert(shared.clone());
    shared
}

/// A record of the cache.
pub trait Record {
    /// Takes over what it can share of `old`, the record it replaces (`None`: the first of
    /// its key), and of `key`, the key it is filed under. Nothing by default.
    fn share(&mut self, key: &ServiceKey, old: Option<&Self>) {
        let _ = (key, old);
    }

    /// Whether this record says nothing `old` (the record of its key) does not: then an
    /// update of the object changes nothing in the cache (no pass is worth it). False by
    /// default: every update counts.
    fn same(&self, old: &Self) -> bool {
        let _ = old;
        false
    }
}

impl Record for String {}

/// Write handle, owned by the watch task.
#[allow(missing_debug_implementations)] // holds a closure
pub struct RecordsWriter<K, T> {
    map: Arc<RwLock<HashMap<ServiceKey, Arc<T>>>>,
    ready: watch::Sender<bool>,
    /// The list in progress.
    buffer: Option<HashMap<ServiceKey, Arc<T>>>,
    keep: Keep<K, T>,
    /// Every namespace seen, shared by the keys (as many as the cluster has had).
    namespaces: HashSet<Arc<str>>,
}

/// Maps an object to its record, or to nothing.
type Keep<K, T> = Box<dyn Fn(&K) -> Option<T> + Send + Sync>;

/// A new cache whose records are `keep(object)`; objects it maps to `None` are not kept
/// (and drop the record of their key, if any).
pub fn records<K, T>(
    keep: impl Fn(&K) -> Option<T> + Send + Sync + 'static,
) -> (Records<T>, RecordsWriter<K, T>) {
    let map = Arc::new(RwLock::new(HashMap::new()));
    let (ready, ready_rx) = watch::channel(false);
    (
        Records {
            map: map.clone(),
            ready: ready_rx,
        },
        RecordsWriter {
            map,
            ready,
            buffer: None,
            keep: Box::new(keep),
            namespaces: HashSet::new(),
        },
    )
}

impl<K: Resource, T: Record> RecordsWriter<K, T> {
    /// Namespace (shared) and name of an object (an empty namespace for cluster-scoped
    /// ones).
    fn key_of(&mut self, object: &K) -> Option<ServiceKey> {
        let meta = object.meta();
        let name = meta.name.as_deref()?;
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        Some(ServiceKey {
            namespace: interned(&mut self.namespaces, namespace),
            name: name.into(),
        })
    }

    /// `record`, filed under `key`, sharing what it can with the record of `key` in `map`
    /// (which then gives the key too).
    fn file(
        map: &HashMap<ServiceKey, Arc<T>>,
        key: ServiceKey,
        mut record: T,
    ) -> (ServiceKey, Arc<T>) {
        let old = map.get_key_value(&key);
        let key = old.map_or(key, |(key, _)| key.clone());
        record.share(&key, old.map(|(_, old)| &**old));
        (key, Arc::new(record))
    }

    /// Applies one watcher event. Returns whether the records may have changed: not for
    /// an object that is not kept and was not (a Service of another class, say, that
    /// never was ours: its changes are nothing to this cache), nor for a relist's events
    /// before its `InitDone`, which replaces them all at once.
    pub fn apply(&mut self, event: &Event<K>) -> bool {
        match event {
            Event::Init => {
                self.buffer = Some(HashMap::new());
                false
            }
            Event::InitApply(object) => {
                if self.buffer.is_none() {
                    return false;
                }
                // Shared with the record it will replace, in the contents the relist ends.
                let Some(key) = self.key_of(object) else {
                    return false;
                };
                if let Some(record) = (self.keep)(object) {
                    let (key, record) = Self::file(&self.read(), key, record);
                    if let Some(buffer) = self.buffer.as_mut() {
                        buffer.insert(key, record);
                    }
                }
                false
            }
            Event::InitDone => {
                if let Some(buffer) = self.buffer.take() {
                    *self.write() = buffer;
                }
                self.ready.send_replace(true);
                true
            }
            Event::Apply(object) => {
                let Some(key) = self.key_of(object) else {
                    return false;
                };
                // Built before the lock: the pass reads the records meanwhile.
                let record = (self.keep)(object);
                let mut map = self.write();
                match record {
                    Some(record) if map.get(&key).is_some_and(|old| record.same(old)) => false,
                    Some(record) => {
                        let (key, record) = Self::file(&map, key, record);
                        map.insert(key, record);
                        true
                    }
                    None => map.remove(&key).is_some(),
                }
            }
            Event::Delete(object) => match self.key_of(object) {
                Some(key) => self.write().remove(&key).is_some(),
                None => false,
            },
        }
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<ServiceKey, Arc<T>>> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<ServiceKey, Arc<T>>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T> Records<T> {
    /// Replaces the record of `key` with `change(record)` when that gives one (from outside
    /// the watch that fills the cache: another watch learned something of it). Returns
    /// whether it did. A relist under way may bring the old record back when it ends.
    pub fn update(&self, key: &ServiceKey, change: impl FnOnce(&T) -> Option<T>) -> bool {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let Some(new) = map.get(key).and_then(|old| change(old)) else {
            return false;
        };
        map.insert(key.clone(), Arc::new(new));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(name: &str, value: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data: Some([("v".to_owned(), value.to_owned())].into()),
            ..ConfigMap::default()
        }
    }

    /// Keeps the value of `v`, except `skip`.
    fn value(cm: &ConfigMap) -> Option<String> {
        cm.data
            .as_ref()?
            .get("v")
            .filter(|v| v.as_str() != "skip")
            .cloned()
    }

    fn values(records: &Records<String>) -> Vec<String> {
        let mut all: Vec<String> = records.snapshot().iter().map(|v| v.to_string()).collect();
        all.sort();
        all
    }

    #[tokio::test]
    async fn a_relist_replaces_the_contents_only_when_complete() {
        let (records, mut writer) = records(value);
        writer.apply(&Event::Init);
        writer.apply(&Event::InitApply(cm("a", "1")));
        assert!(records.is_empty(), "a list in progress is not visible");
        writer.apply(&Event::InitDone);
        records.wait_until_ready().await.unwrap();
        assert_eq!(values(&records), ["1"]);

        writer.apply(&Event::Init);
        writer.apply(&Event::InitApply(cm("b", "2")));
        assert_eq!(
            values(&records),
            ["1"],
            "the old contents stay until the relist ends"
        );
        writer.apply(&Event::InitDone);
        assert_eq!(values(&records), ["2"], "a was gone from the relist");
    }

    #[test]
    fn apply_and_delete_follow_the_object() {
        let (records, mut writer) = records(value);
        writer.apply(&Event::Init);
        writer.apply(&Event::InitDone);
        writer.apply(&Event::Apply(cm("a", "1")));
        writer.apply(&Event::Apply(cm("a", "2")));
        assert_eq!(
            values(&records),
            ["2"],
            "a second apply replaces the record"
        );
        assert!(writer.apply(&Event::Apply(cm("a", "skip"))));
        assert!(
            records.is_empty(),
            "an object no longer kept drops its record"
        );
        // An object never kept changes nothing, applied or deleted.
        assert!(!writer.apply(&Event::Apply(cm("a", "skip"))));
        assert!(!writer.apply(&Event::Delete(cm("a", "skip"))));
        assert!(writer.apply(&Event::Apply(cm("b", "3"))));
        assert!(writer.apply(&Event::Delete(cm("b", "3"))));
        assert!(!writer.apply(&Event::Delete(cm("b", "3"))), "already gone");
        assert!(records.is_empty());
    }

    #[tokio::test]
    async fn a_dropped_writer_is_never_ready() {
        let (records, writer) = records(value);
        drop(writer);
        assert!(records.wait_until_ready().await.is_err());
    }
}
