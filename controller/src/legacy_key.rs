//! The Secret of earlier releases that held the one key every node signed its
//! fast-failover adverts with ([`keys::LEGACY_ADVERT_KEY_SECRET`]). Each node signs with a
//! key of its own now ([`aliaslb_core::advert`]), so nothing reads it: every replica
//! deletes it once at start, and an install never has a key every node can sign with. An
//! agent of an earlier release still running keeps the key it read (a missing Secret was
//! no instruction to it); the upgrade order of docs/operations.md (agents first) leaves none.

use aliaslb_core::keys;
use k8s_openapi::api::core::v1::Secret;
use kube::api::DeleteParams;
use kube::{Api, Client};

/// Deletes the legacy Secret in `namespace` if it is there; says what happened. Never
/// fails the controller: a Secret left behind is read by nothing.
pub async fn delete(client: Client, namespace: String) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    match api
        .delete(keys::LEGACY_ADVERT_KEY_SECRET, &DeleteParams::default())
        .await
    {
        Ok(_) => tracing::info!(
            secret = keys::LEGACY_ADVERT_KEY_SECRET,
            %namespace,
            "deleted the shared advert key of earlier releases: every node signs with a key of its own"
        ),
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(error) => tracing::warn!(
            secret = keys::LEGACY_ADVERT_KEY_SECRET,
            %namespace,
            %error,
            "could not delete the shared advert key of earlier releases (nothing reads it; delete it by hand)"
        ),
    }
}
