//! The key of the fast-failover adverts ([`aliaslb_core::advert`]): the Secret
//! [`keys::ADVERT_KEY_SECRET`] in the controller's namespace, created with 32 random bytes
//! when missing. Every replica may create it: the API keeps the first, the others read
//! `AlreadyExists`. An existing key is never replaced (an operator rotates it by deleting
//! the Secret: agents re-read it every [`aliaslb_core::advert`] key interval).

use std::collections::BTreeMap;
use std::time::Duration;

use aliaslb_core::{advert, keys};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// How often the Secret is looked at again (it may be deleted to rotate the key).
const CHECK_EVERY: Duration = Duration::from_secs(60);

/// Makes sure the Secret exists, now and every [`CHECK_EVERY`]; never returns.
pub async fn keep(client: Client, namespace: String) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let mut delay = Duration::from_secs(1);
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
                delay = Duration::from_secs(1);
                tokio::time::sleep(CHECK_EVERY).await;
            }
            Err(error) => {
                tracing::warn!(
                    secret = keys::ADVERT_KEY_SECRET,
                    %namespace,
                    %error,
                    "cannot read or create the advert key: agents fail over by the Lease only until it exists"
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(CHECK_EVERY);
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
