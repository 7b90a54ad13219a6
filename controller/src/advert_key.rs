//! The key of the fast-failover adverts ([`aliaslb_core::advert`]): the Secret
//! [`keys::ADVERT_KEY_SECRET`] in the controller's namespace, created with 32 random bytes
//! when missing. Every replica may create it: the API keeps the first, the others read
//! `AlreadyExists`. An existing key is never replaced (an operator rotates it by deleting
//! the Secret: agents re-read it every [`aliaslb_core::advert`] key interval).

use std::collections::BTreeMap;
use std::time::Duration;

use aliaslb_core::{advert, keys};
use aliaslb_ops::backoff::{Backoff, jittered};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// How often, at most, the Secret is looked at again (it may be deleted to rotate the
/// key); each wait is drawn from `[CHECK_EVERY / 2, CHECK_EVERY]`.
const CHECK_EVERY: Duration = Duration::from_secs(60);

/// Makes sure the Secret exists, now and every [`CHECK_EVERY`] (jittered); after a failure
/// retries with a jittered backoff from 1 s to [`CHECK_EVERY`] ([`aliaslb_ops::backoff`]:
/// replicas that one API outage failed together do not retry together); never returns.
pub async fn keep(client: Client, namespace: String) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let mut backoff = Backoff::new(Duration::from_secs(1), CHECK_EVERY);
    loop {
        match ensure(&api).await {
            Ok(created) => {
                if created {
                    tracing::info!(
                        secret = keys::ADVERT_KEY_SECRET,
                        %namespace,
                        "created the advert key of fast L2 failover"
                    );
                }
                backoff.reset();
                tokio::time::sleep(jittered(CHECK_EVERY)).await;
            }
            Err(error) => {
                tracing::warn!(
                    secret = keys::ADVERT_KEY_SECRET,
                    %namespace,
                    %error,
                    "cannot read or create the advert key: agents fail over by the Lease only until it exists"
                );
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    }
}

/// Creates the Secret if it is missing; returns whether it did.
async fn ensure(api: &Api<Secret>) -> Result<bool, kube::Error> {
    if api.get_opt(keys::ADVERT_KEY_SECRET).await?.is_some() {
        return Ok(false);
    }
    let key = advert::generate_key().map_err(|e| {
        kube::Error::Service(std::io::Error::other(format!("no advert key: {e}")).into())
    })?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(keys::ADVERT_KEY_SECRET.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "aliaslb".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            keys::ADVERT_KEY_DATA.to_owned(),
            ByteString(key.to_vec()),
        )])),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
