//! Namespaces -> their labels, which pools that grant by `namespaceSelector` read
//! ([`aliaslb_core::pool::Tenancy`]). Pure: the Namespace watch ([`crate::watch`]) keeps
//! only their metadata; the reconcile loop and `aliaslb pools` read the labels from it.

use std::collections::BTreeMap;

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
    fn labels_by_namespace() {
        let got = labels(&[meta("a", &[("tier", "internal")]), meta("b", &[])]);
        assert_eq!(got["a"]["tier"], "internal");
        assert!(got["b"].is_empty(), "a namespace without labels has none");
        assert_eq!(got.len(), 2);
    }
}
