//! [`TestEnv`]: one etcd + kube-apiserver pair on loopback, its kubeconfig and clients, plus an
//! optional kube-controller-manager. Does I/O: temp files, subprocesses, HTTP to the apiserver.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use crate::Error;
use crate::assets;
use crate::certs::{self, Certs};
use crate::process::Supervised;

/// How long etcd + kube-apiserver may take to report ready.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// How many times start-up is retried when a picked free port got taken meanwhile.
const PORT_RETRIES: u32 = 3;
/// The range Services get cluster IPs from.
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/12";
/// The user name of the static admin token (member of `system:masters`).
pub const ADMIN_USER: &str = "aliaslb-admin";

/// A running etcd + kube-apiserver on loopback.
///
/// Share one per test binary with [`TestEnv::global`] and isolate tests by namespace
/// ([`TestEnv::create_namespace`]); every test builds its own client with [`TestEnv::client`]
/// because a `kube::Client` is bound to the tokio runtime that created it.
///
/// Dropping a `TestEnv` stops both servers and removes its folder; so does the test process
/// exiting in any way (see the `process` module), which is what cleans up the global one.
/// Set `ALIASLB_TESTENV_KEEP=1` to keep the folder (logs, etcd data) for debugging.
#[derive(Debug)]
pub struct TestEnv {
    dir: PathBuf,
    certs: Certs,
    kubeconfig: PathBuf,
    server_url: String,
    etcd_url: String,
    token: String,
    namespaces: AtomicU32,
    /// The kube-apiserver binary and flags, to start it again ([`TestEnv::start_apiserver`]).
    apiserver_bin: PathBuf,
    apiserver_args: Vec<String>,
    /// kube-apiserver starts so far (the first included): names each start's log.
    apiserver_starts: u32,
    // Declaration order is drop order: the apiserver stops before etcd.
    apiserver: Supervised,
    etcd: Supervised,
}

impl TestEnv {
    /// The environment shared by all tests of this test binary, started on first use.
    ///
    /// Blocks while starting (a few seconds); callable from sync or async code.
    ///
    /// # Panics
    /// When the environment cannot start: the message says why, with the tail of the server log,
    /// or which command builds missing binaries. Every later call panics with the same message.
    pub fn global() -> &'static TestEnv {
        static GLOBAL: OnceLock<Result<TestEnv, String>> = OnceLock::new();
        match GLOBAL.get_or_init(|| TestEnv::start().map_err(|e| e.to_string())) {
            Ok(env) => env,
            Err(message) => panic!("aliaslb-testenv: {message}"),
        }
    }

    /// Starts a private environment (prefer [`TestEnv::global`]: each start costs seconds).
    ///
    /// # Errors
    /// See [`Error`]; a start-up failure carries the tail of the failing server's log.
    pub fn start() -> Result<TestEnv, Error> {
        Self::start_with(&[])
    }

    /// Like [`TestEnv::start`], appending `extra_apiserver_args` (e.g.
    /// `--disable-admission-plugins=ServiceAccount`) to the kube-apiserver command line.
    ///
    /// # Errors
    /// See [`TestEnv::start`].
    pub fn start_with(extra_apiserver_args: &[&str]) -> Result<TestEnv, Error> {
        let mut attempt = 1;
        loop {
            match Self::start_once(extra_apiserver_args) {
                Err(Error::StartUp { ref tail, .. })
                    if attempt < PORT_RETRIES && tail.contains("address already in use") =>
                {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn start_once(extra_apiserver_args: &[&str]) -> Result<TestEnv, Error> {
        let etcd_bin = assets::binary("etcd")?;
        let apiserver_bin = assets::binary("kube-apiserver")?;
        let dir = make_dir()?;
        let keep = std::env::var_os("ALIASLB_TESTENV_KEEP").is_some_and(|v| v != "0");
        let certs = certs::generate(&dir)?;

        let token = format!("aliaslb-{:x}-{}", nanos(), std::process::id());
        let token_file = dir.join("tokens.csv");
        write(
            &token_file,
            &format!("{token},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n"),
        )?;

        let [etcd_port, peer_port, api_port] = [free_port()?, free_port()?, free_port()?];
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = vec![
            "--name=testenv".to_owned(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=testenv={peer_url}"),
            "--logger=zap".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        // The etcd supervisor stops last when dropped, so it removes the folder.
        let cleanup = (!keep).then_some(dir.as_path());
        let mut etcd = Supervised::spawn(
            "etcd",
            &etcd_bin,
            &etcd_args,
            &dir.join("etcd.log"),
            cleanup,
        )?;

        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", certs.server_cert.display()),
            format!("--tls-private-key-file={}", certs.server_key.display()),
            format!("--client-ca-file={}", certs.ca_cert.display()),
            format!("--token-auth-file={}", token_file.display()),
            "--authorization-mode=Node,RBAC".to_owned(),
            format!("--service-account-key-file={}", certs.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                certs.sa_key.display()
            ),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
            // The `kubernetes` Service endpoints would point at 127.0.0.1, which Endpoints
            // validation rejects; with no reconciler the apiserver does not try.
            "--endpoint-reconciler-type=none".to_owned(),
            "--allow-privileged=true".to_owned(),
            "--v=1".to_owned(),
        ];
        apiserver_args.extend(extra_apiserver_args.iter().map(|a| (*a).to_owned()));
        let mut apiserver = Supervised::spawn(
            "kube-apiserver",
            &apiserver_bin,
            &apiserver_args,
            &dir.join("kube-apiserver.log"),
            None,
        )?;

        let server_url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = dir.join("kubeconfig");
        write(
            &kubeconfig,
            &kubeconfig_yaml(&server_url, &certs.ca_cert, &token),
        )?;

        wait_ready(&kubeconfig, &mut etcd, &mut apiserver, START_TIMEOUT)?;
        eprintln!(
            "aliaslb-testenv: kube-apiserver {server_url} ready, etcd {etcd_url}, dir {}",
            dir.display()
        );
        Ok(TestEnv {
            dir,
            certs,
            kubeconfig,
            server_url,
            etcd_url,
            token,
            namespaces: AtomicU32::new(0),
            apiserver_bin,
            apiserver_args,
            apiserver_starts: 1,
            apiserver,
            etcd,
        })
    }

    /// Stops kube-apiserver as a restart does (SIGTERM: it closes its connections and
    /// watches; SIGKILL after 10 s) and waits until it is gone; etcd keeps running. Clients
    /// then meet a closed port until [`TestEnv::start_apiserver`].
    pub fn stop_apiserver(&mut self) {
        self.apiserver.stop();
    }

    /// Starts kube-apiserver again, with the same flags on the same port and etcd, and
    /// waits up to `within` for `/readyz` (a start under the load of many clients
    /// retrying may take longer than a first start); its output goes to
    /// `kube-apiserver-N.log` for the N-th start.
    ///
    /// # Errors
    /// [`Error::StartUp`] with the log tail when it exits or is not ready within `within`.
    pub fn start_apiserver(&mut self, within: Duration) -> Result<(), Error> {
        self.apiserver.stop();
        self.apiserver_starts += 1;
        let log = self
            .dir
            .join(format!("kube-apiserver-{}.log", self.apiserver_starts));
        self.apiserver = Supervised::spawn(
            "kube-apiserver",
            &self.apiserver_bin,
            &self.apiserver_args,
            &log,
            None,
        )?;
        wait_ready(
            &self.kubeconfig,
            &mut self.etcd,
            &mut self.apiserver,
            within,
        )
    }

    /// The folder holding certificates, logs, etcd data and the kubeconfig.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kubeconfig (admin token, CA) for subprocesses: set `KUBECONFIG` to it.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The apiserver URL, `https://127.0.0.1:PORT`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The etcd client URL, `http://127.0.0.1:PORT`.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The bearer token of [`ADMIN_USER`] (group `system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.token
    }

    /// The generated key material (CA, serving cert, service-account key).
    pub fn certs(&self) -> &Certs {
        &self.certs
    }

    /// The kube-apiserver log file.
    pub fn apiserver_log(&self) -> &Path {
        self.apiserver.log()
    }

    /// The etcd log file.
    pub fn etcd_log(&self) -> &Path {
        self.etcd.log()
    }

    /// A client config for the admin user, loaded from [`TestEnv::kubeconfig_path`].
    ///
    /// # Errors
    /// [`Error::Kubeconfig`] when the file cannot be read or used.
    pub async fn config(&self) -> Result<Config, Error> {
        load_config(&self.kubeconfig).await
    }

    /// Runs `kubectl ARGS` as the admin against this apiserver (`kubectl` must be on PATH, as
    /// it is what users install with); returns stdout.
    ///
    /// # Panics
    /// When kubectl cannot run or fails, with its stderr.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("kubectl")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running kubectl (is it installed and on PATH?): {e}"));
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A new admin client. Call it in each test: a client only works on the runtime that made it.
    ///
    /// # Panics
    /// When the kubeconfig cannot be loaded or the client cannot be built.
    pub async fn client(&self) -> Client {
        let config = self.config().await.unwrap_or_else(|e| panic!("{e}"));
        Client::try_from(config).unwrap_or_else(|e| panic!("building admin client: {e}"))
    }

    /// A new client that impersonates `user` with `groups` (the admin may impersonate anyone).
    ///
    /// # Panics
    /// Like [`TestEnv::client`].
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Client {
        let mut config = self.config().await.unwrap_or_else(|e| panic!("{e}"));
        config.auth_info.impersonate = Some(user.to_owned());
        config.auth_info.impersonate_groups =
            Some(groups.iter().map(|g| (*g).to_owned()).collect());
        Client::try_from(config).unwrap_or_else(|e| panic!("building client as {user}: {e}"))
    }

    /// A new client that authenticates with a real ServiceAccount token of `namespace/name`
    /// from the TokenRequest API, bound to `bound` when given: a Pod's token (what a pod's
    /// projected token is) carries the `authentication.kubernetes.io/node-name` extra of the
    /// Pod's node on 1.30+, a Node-bound one on 1.31+. Unlike
    /// [`TestEnv::service_account_client`], the ServiceAccount (and the bound object) must exist.
    ///
    /// # Panics
    /// When the TokenRequest fails, or like [`TestEnv::client`].
    pub async fn token_client(
        &self,
        namespace: &str,
        name: &str,
        bound: Option<TokenBinding<'_>>,
    ) -> Client {
        use k8s_openapi::api::authentication::v1::{
            BoundObjectReference, TokenRequest, TokenRequestSpec,
        };
        use k8s_openapi::api::core::v1::{Node, Pod};
        let admin = self.client().await;
        let reference = |kind: &str, object: &str, uid: Option<String>| BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some(kind.into()),
            name: Some(object.into()),
            uid,
        };
        let bound_object_ref = match bound {
            Some(TokenBinding::Node(node)) => {
                let got = Api::<Node>::all(admin.clone()).get(node).await;
                let uid = got.unwrap_or_else(|e| panic!("reading Node {node}: {e}"));
                Some(reference("Node", node, uid.metadata.uid))
            }
            Some(TokenBinding::Pod(pod)) => {
                let got = Api::<Pod>::namespaced(admin.clone(), namespace)
                    .get(pod)
                    .await;
                let uid = got.unwrap_or_else(|e| panic!("reading Pod {namespace}/{pod}: {e}"));
                Some(reference("Pod", pod, uid.metadata.uid))
            }
            None => None,
        };
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![],
                bound_object_ref,
                expiration_seconds: Some(3600),
            },
            ..TokenRequest::default()
        };
        let token = Api::<ServiceAccount>::namespaced(admin, namespace)
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{name}: {e}"))
            .status
            .map(|s| s.token)
            .unwrap_or_default();
        let mut config = self.config().await.unwrap_or_else(|e| panic!("{e}"));
        config.auth_info.token = Some(token.into());
        Client::try_from(config)
            .unwrap_or_else(|e| panic!("building client for {namespace}/{name}: {e}"))
    }

    /// A new client acting as ServiceAccount `namespace/name`, i.e. user
    /// `system:serviceaccount:NAMESPACE:NAME` with the groups the apiserver gives such tokens.
    /// The ServiceAccount object itself need not exist: RBAC only looks at the name.
    ///
    /// # Panics
    /// Like [`TestEnv::client`].
    pub async fn service_account_client(&self, namespace: &str, name: &str) -> Client {
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let ns_group = format!("system:serviceaccounts:{namespace}");
        self.client_as(
            &user,
            &["system:serviceaccounts", &ns_group, "system:authenticated"],
        )
        .await
    }

    /// Creates a namespace named after `hint` (sanitised to a DNS label) plus a counter unique in
    /// this environment, and returns its name. Namespaces are not deleted afterwards: without a
    /// kube-controller-manager they would never finish terminating anyway.
    ///
    /// # Panics
    /// When the API call fails.
    pub async fn create_namespace(&self, client: &Client, hint: &str) -> String {
        let n = self.namespaces.fetch_add(1, Ordering::Relaxed) + 1;
        let name = namespace_name(hint, n);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("aliaslb-testenv: creating namespace {name}: {e}"));
        name
    }

    /// Starts kube-controller-manager against this apiserver (ServiceAccounts, namespace
    /// deletion, EndpointSlices, garbage collection...) and waits until it works: the
    /// `default` ServiceAccount in `default` exists. Stops when the handle is dropped. Run at
    /// most one at a time per environment (leader election is off).
    ///
    /// # Errors
    /// [`Error::MissingBinary`] when it is not built; [`Error::StartUp`] with its log tail when
    /// it exits or shows no effect within 60 s.
    pub async fn start_controller_manager(&self) -> Result<ControllerManager, Error> {
        static STARTS: AtomicU32 = AtomicU32::new(0);
        let bin = assets::binary("kube-controller-manager")?;
        let n = STARTS.fetch_add(1, Ordering::Relaxed) + 1;
        let certs = &self.certs;
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!(
                "--service-account-private-key-file={}",
                certs.sa_key.display()
            ),
            format!("--root-ca-file={}", certs.ca_cert.display()),
            format!("--cluster-signing-cert-file={}", certs.ca_cert.display()),
            format!("--cluster-signing-key-file={}", certs.ca_key.display()),
            "--authentication-skip-lookup=true".to_owned(),
            "--use-service-account-credentials=false".to_owned(),
            "--leader-elect=false".to_owned(),
            // No serving: nothing scrapes it, and it would need its own certificates.
            "--secure-port=0".to_owned(),
            "--controllers=*".to_owned(),
            "--v=1".to_owned(),
        ];
        let log = self.dir.join(format!("kube-controller-manager-{n}.log"));
        let mut process = Supervised::spawn("kube-controller-manager", &bin, &args, &log, None)?;

        let client = self.client().await;
        let accounts = Api::<ServiceAccount>::namespaced(client, "default");
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::from("no default ServiceAccount yet");
        loop {
            if let Some(status) = process.exited() {
                return Err(process.startup_error(format!("exited with {status}")));
            }
            if Instant::now() > deadline {
                return Err(process.startup_error(format!("not working after 60 s: {last}")));
            }
            // The ServiceAccount controller's first work (token Secrets are gone since 1.24:
            // tokens come from TokenRequest, served by the apiserver itself).
            match accounts.get_opt("default").await {
                Ok(Some(_)) => return Ok(ControllerManager { process }),
                Ok(None) => last = "ServiceAccount default/default not created yet".into(),
                Err(e) => last = format!("reading ServiceAccount default/default: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A running kube-controller-manager; dropping it stops the process.
#[derive(Debug)]
pub struct ControllerManager {
    process: Supervised,
}

impl ControllerManager {
    /// Its log file.
    pub fn log(&self) -> &Path {
        self.process.log()
    }
}

/// A DNS-label namespace name from a free-form hint and a counter.
fn namespace_name(hint: &str, n: u32) -> String {
    let mut base: String = hint
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base.truncate(50);
    let base = base.trim_matches('-');
    let base = if base.is_empty() { "test" } else { base };
    format!("{base}-{n}")
}

/// Polls `GET /readyz` until it answers `ok`, failing early when a server exits.
///
/// Runs on its own thread and runtime so that it works from sync code and from inside a
/// `#[tokio::test]` alike (a runtime cannot be blocked on from within another).
fn wait_ready(
    kubeconfig: &Path,
    etcd: &mut Supervised,
    apiserver: &mut Supervised,
    within: Duration,
) -> Result<(), Error> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| {
                        apiserver.startup_error(format!("building a tokio runtime: {e}"))
                    })?;
                runtime.block_on(poll_ready(kubeconfig, etcd, apiserver, within))
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

async fn poll_ready(
    kubeconfig: &Path,
    etcd: &mut Supervised,
    apiserver: &mut Supervised,
    within: Duration,
) -> Result<(), Error> {
    let mut config = load_config(kubeconfig).await?;
    config.connect_timeout = Some(Duration::from_secs(2));
    config.read_timeout = Some(Duration::from_secs(5));
    let client = Client::try_from(config)
        .map_err(|e| apiserver.startup_error(format!("building the readiness client: {e}")))?;
    let started = Instant::now();
    let mut last = String::from("no answer yet");
    loop {
        if let Some(status) = etcd.exited() {
            return Err(etcd.startup_error(format!("exited with {status}")));
        }
        if let Some(status) = apiserver.exited() {
            return Err(apiserver.startup_error(format!("exited with {status}")));
        }
        if started.elapsed() > within {
            return Err(apiserver.startup_error(format!(
                "/readyz not ok after {within:?}; last answer: {last}"
            )));
        }
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| apiserver.startup_error(format!("building GET /readyz: {e}")))?;
        match client.request_text(request).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => last = body,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn load_config(kubeconfig: &Path) -> Result<Config, Error> {
    let to_error = |source| Error::Kubeconfig {
        path: kubeconfig.to_owned(),
        source,
    };
    let file = Kubeconfig::read_from(kubeconfig).map_err(to_error)?;
    Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(to_error)
}

/// The kubeconfig text; values are JSON strings, which YAML reads verbatim.
fn kubeconfig_yaml(server_url: &str, ca_cert: &Path, token: &str) -> String {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: aliaslb-testenv\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority: {ca}\n\
         users:\n\
         - name: {user}\n  \
           user:\n    \
             token: {token}\n\
         contexts:\n\
         - name: aliaslb-testenv\n  \
           context:\n    \
             cluster: aliaslb-testenv\n    \
             user: {user}\n    \
             namespace: default\n\
         current-context: aliaslb-testenv\n",
        server = q(server_url),
        ca = q(&ca_cert.display().to_string()),
        user = q(ADMIN_USER),
        token = q(token),
    )
}

/// A fresh folder for one environment: under `$ALIASLB_TESTENV_TMPDIR`, else `/dev/shm` (etcd
/// fsyncs every write; on tmpfs that is free), else the system temp dir.
fn make_dir() -> Result<PathBuf, Error> {
    let base = std::env::var_os("ALIASLB_TESTENV_TMPDIR")
        .map(PathBuf::from)
        .or_else(|| {
            let shm = Path::new("/dev/shm");
            shm.is_dir().then(|| shm.to_owned())
        })
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix("aliaslb-testenv-")
        .tempdir_in(&base)
        .map_err(|source| Error::Io {
            action: "create temp dir in",
            path: base.clone(),
            source,
        })?
        .keep();
    if dir.to_str().is_none() {
        return Err(Error::Io {
            action: "use temp dir (the path must be UTF-8; set ALIASLB_TESTENV_TMPDIR)",
            path: dir,
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        });
    }
    Ok(dir)
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::Io {
        action: "write",
        path: path.to_owned(),
        source,
    })
}

/// A loopback TCP port nobody listens on right now (the OS picks it; a race with other
/// processes is possible, hence the retry in [`TestEnv::start_with`]).
fn free_port() -> Result<u16, Error> {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|source| Error::Io {
            action: "bind a free port on",
            path: PathBuf::from("127.0.0.1"),
            source,
        })?;
    Ok(addr.port())
}

fn nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::namespace_name;

    #[test]
    fn namespace_names_are_dns_labels() {
        assert_eq!(namespace_name("Lease_Renewal", 3), "lease-renewal-3");
        assert_eq!(namespace_name("--", 1), "test-1");
        let long = namespace_name(&"x".repeat(100), 12);
        assert_eq!(long, format!("{}-12", "x".repeat(50)));
    }
}

/// What a [`TestEnv::token_client`] token is bound to.
#[derive(Debug, Clone, Copy)]
pub enum TokenBinding<'a> {
    /// A Node, by name.
    Node(&'a str),
    /// A Pod in the ServiceAccount's namespace, by name.
    Pod(&'a str),
}
