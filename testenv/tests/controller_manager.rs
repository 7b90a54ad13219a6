//! kube-controller-manager started by the test environment does its job against the test
//! apiserver: namespaces get their `default` ServiceAccount, which can then have tokens
//! (TokenRequest), and deleted namespaces finish terminating. Its own test
//! binary, so its controllers never act on the namespaces of other test files.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Api;
use kube::api::PostParams;

use aliaslb_testenv::TestEnv;

#[tokio::test]
async fn controller_manager_creates_service_accounts_and_finishes_namespace_deletion() {
    let env = TestEnv::global();
    let client = env.client().await;
    let ns = env.create_namespace(&client, "kcm").await;
    let cm = env
        .start_controller_manager()
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &ns);
    let account_found = wait_for(Duration::from_secs(30), || async {
        accounts.get_opt("default").await.unwrap().is_some()
    })
    .await;
    assert!(
        account_found,
        "no default ServiceAccount in {ns}; log {}",
        cm.log().display()
    );
    // Since 1.24 tokens come from TokenRequest, not from Secrets the controller manager writes.
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request("default", &PostParams::default(), &request)
        .await
        .expect("TokenRequest for the default ServiceAccount");
    assert!(
        token.status.is_some_and(|s| !s.token.is_empty()),
        "TokenRequest returned no token"
    );

    let namespaces = Api::<Namespace>::all(client);
    namespaces.delete(&ns, &Default::default()).await.unwrap();
    let gone = wait_for(Duration::from_secs(60), || async {
        namespaces.get_opt(&ns).await.unwrap().is_none()
    })
    .await;
    assert!(
        gone,
        "namespace {ns} still terminating; log {}",
        cm.log().display()
    );
}

async fn wait_for<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}
