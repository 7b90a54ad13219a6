//! Namespaces -> their labels, which pools that grant by `namespaceSelector` read
//! ([`aliaslb_core::pool::Tenancy`]). Pure: the Namespace watch ([`crate::watch`]) keeps
//! only their metadata; the reconcile loop and `aliaslb pools` read the labels from it.

use std::collections::{BTreeMap, BTreeSet};

use aliaslb_core::pool::Labels;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The labels of each namespace, by name (a namespace without labels maps to none).
pub fn labels<'a>(metas: impl IntoIterator<Item = &'a ObjectMeta>) -> BTreeMap<String, Labels> {
    metas
        .into_iter()
        .filter_map(|meta| {
            let name = meta.name.clone()?;
            Some((name, meta.labels.clone().unwrap_or_default()))
        })
        .collect()
}

/// The namespaces whose labels differ between `before` and `after` (present in one only,
/// or labelled otherwise).
pub fn changed(
    before: &BTreeMap<String, Labels>,
    after: &BTreeMap<String, Labels>,
) -> BTreeSet<String> {
    let names: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    names
        .into_iter()
        .filter(|name| before.get(*name) != after.get(*name))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            labels: (!labels.is_empty()).then(|| {
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn labels_by_namespace_and_what_changed() {
        let before = labels(&[meta("a", &[("tier", "internal")]), meta("b", &[])]);
        assert_eq!(before["a"]["tier"], "internal");
        assert!(before["b"].is_empty());
        let after = labels(&[
            meta("a", &[("tier", "edge")]),
            meta("b", &[]),
            meta("c", &[]),
        ]);
        let names: Vec<String> = changed(&before, &after).into_iter().collect();
        assert_eq!(names, ["a", "c"], "relabelled and new; b unchanged");
        assert!(changed(&after, &after).is_empty());
        let gone = labels(&[meta("b", &[])]);
        let names: Vec<String> = changed(&after, &gone).into_iter().collect();
        assert_eq!(names, ["a", "c"], "gone");
    }
}
