//! Which IPs this node must carry: every IP in `status.loadBalancer.ingress` of a Service
//! whose `aliaslb.io/node` annotation names this node, on the interface its
//! `aliaslb.io/interface` annotation names, if any. Nothing else is ever acted on. The
//! Service's ports (`spec.ports`: port and protocol, never its NodePorts) are what the
//! host-port shield opens on those IPs.
//!
//! [`Assignments`] is the pure state fed by watch events; [`watch_services`] does the API
//! I/O (one cluster-wide Service watch) and publishes the [`DesiredSet`] on a channel,
//! only once the initial list is complete, so a restarted agent never drops aliases it
//! has not seen the Services of yet.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use aliaslb_core::keys;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::aliases::DesiredSet;
use crate::shield::{OpenPort, Protocol};

/// Fastest watch retry after an error.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
/// Slowest watch retry: kept short, so an agent picks up changes made during an API
/// outage within seconds of the API coming back (one agent per node, one watch each).
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What one Service asks of this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAssignment {
    /// The IPs to carry.
    pub ips: Vec<IpAddr>,
    /// The interface the controller asked for, if any.
    pub interface: Option<String>,
    /// Ingress entries whose `ip` is not an IP address (reported, skipped).
    pub invalid: Vec<String>,
    /// The ports the Service opens on its IPs.
    pub ports: Vec<OpenPort>,
}

/// What `service` asks of `node`: `None` when its node annotation does not name `node`.
pub fn assignment_for(service: &Service, node: &str) -> Option<NodeAssignment> {
    let annotations = service.metadata.annotations.as_ref()?;
    if annotations.get(keys::ANNOTATION_NODE).map(String::as_str) != Some(node) {
        return None;
    }
    let interface = annotations
        .get(keys::ANNOTATION_INTERFACE)
        .map(|i| i.trim())
        .filter(|i| !i.is_empty())
        .map(str::to_owned);
    let mut out = NodeAssignment {
        interface,
        ..NodeAssignment::default()
    };
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    for p in ports.into_iter().flatten() {
        let protocol = Protocol::from_service(p.protocol.as_deref());
        match (protocol, u16::try_from(p.port)) {
            (Some(protocol), Ok(port)) => out.ports.push(OpenPort { protocol, port }),
            // The API accepts only TCP, UDP and SCTP ports 1-65535: nothing to open.
            _ => out.invalid.push(format!(
                "port {} {}",
                p.port,
                p.protocol.as_deref().unwrap_or("TCP")
            )),
        }
    }
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    for entry in ingress.into_iter().flatten() {
        if let Some(ip) = &entry.ip {
            match ip.parse() {
                Ok(ip) => out.ips.push(ip),
                Err(_) => out.invalid.push(ip.clone()),
            }
        }
    }
    Some(out)
}

/// `namespace/name` of a Service.
fn key_of(service: &Service) -> String {
    format!(
        "{}/{}",
        service.namespace().unwrap_or_default(),
        service.name_any()
    )
}

/// The Services assigned to this node, kept up to date from watch events.
#[derive(Debug, Clone)]
pub struct Assignments {
    node: String,
    by_service: BTreeMap<String, NodeAssignment>,
    /// Filled during a (re-)list, swapped in at its end.
    listing: Option<BTreeMap<String, NodeAssignment>>,
    synced: bool,
}

impl Assignments {
    /// Nothing known yet for `node`.
    pub fn new(node: impl Into<String>) -> Self {
        Assignments {
            node: node.into(),
            by_service: BTreeMap::new(),
            listing: None,
            synced: false,
        }
    }

    /// Applies one watch event; returns whether the assigned set may have changed.
    pub fn apply(&mut self, event: watcher::Event<Service>) -> bool {
        match event {
            watcher::Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(service) => {
                if let Some(a) = self.assignment(&service) {
                    self.listing
                        .get_or_insert_default()
                        .insert(key_of(&service), a);
                }
                false
            }
            watcher::Event::InitDone => {
                self.by_service = self.listing.take().unwrap_or_default();
                self.synced = true;
                true
            }
            watcher::Event::Apply(service) => {
                let key = key_of(&service);
                match self.assignment(&service) {
                    Some(a) => self.by_service.insert(key, a.clone()) != Some(a),
                    None => self.by_service.remove(&key).is_some(),
                }
            }
            watcher::Event::Delete(service) => self.by_service.remove(&key_of(&service)).is_some(),
        }
    }

    fn assignment(&self, service: &Service) -> Option<NodeAssignment> {
        let a = assignment_for(service, &self.node)?;
        if !a.invalid.is_empty() {
            warn!(service = %key_of(service), invalid = ?a.invalid, "ingress entries that are not IP addresses, and ports of unknown protocols, are ignored");
        }
        Some(a)
    }

    /// The desired set, once a complete list was seen (`None` before).
    pub fn desired(&self) -> Option<DesiredSet> {
        self.synced.then(|| {
            let mut set = DesiredSet::new();
            for a in self.by_service.values() {
                for ip in &a.ips {
                    set.insert(*ip, a.interface.clone());
                    set.open(*ip, a.ports.iter().copied());
                }
            }
            set
        })
    }
}

/// Doubling retry delay between [`BACKOFF_MIN`] and [`BACKOFF_MAX`], reset by the first
/// event that proves the API answered.
///
/// Not kube's `StreamBackoff`: it resets on every `Ok` item, and the watcher yields
/// `Event::Init` *before* its list request, so during an outage the delay never grew.
#[derive(Debug, Clone)]
struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    fn new() -> Self {
        WatchBackoff { next: BACKOFF_MIN }
    }

    fn next_delay(&mut self) -> Duration {
        let now = self.next;
        self.next = (now * 2).min(BACKOFF_MAX);
        now
    }

    fn reset(&mut self) {
        self.next = BACKOFF_MIN;
    }
}

/// Watches all Services (forever, retrying on errors) and publishes this node's desired
/// set on `tx` after the initial list and after every change of it.
pub async fn watch_services(client: Client, node: String, tx: watch::Sender<Option<DesiredSet>>) {
    let api: Api<Service> = Api::all(client);
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    let mut assignments = Assignments::new(node);
    let mut backoff = WatchBackoff::new();
    let mut failing = false;
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => {
                // `Init` comes before the list request: it proves nothing about the API.
                if !matches!(event, watcher::Event::Init) {
                    backoff.reset();
                    if failing {
                        info!("Service watch works again");
                        failing = false;
                    }
                }
                if assignments.apply(event)
                    && let Some(desired) = assignments.desired()
                {
                    debug!(desired = desired.len(), "desired set updated");
                    tx.send_if_modified(|current| {
                        let changed = current.as_ref() != Some(&desired);
                        *current = Some(desired);
                        changed
                    });
                }
            }
            Err(error) => {
                let delay = backoff.next_delay();
                if failing {
                    debug!(%error, ?delay, "Service watch still failing");
                } else {
                    warn!(%error, ?delay, "Service watch failed; retrying (the aliases held stay)");
                    failing = true;
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceStatus};

    /// A Service `ns/name` with no annotations and no status.
    fn service(name: &str) -> Service {
        let mut s = Service::default();
        s.metadata.namespace = Some("ns".into());
        s.metadata.name = Some(name.into());
        s
    }

    trait ServiceBuilder {
        fn on_node(self, node: &str) -> Self;
        fn on_interface(self, interface: &str) -> Self;
        fn with_ips(self, ips: &[&str]) -> Self;
        fn with_port(self, port: i32, protocol: &str) -> Self;
    }

    impl ServiceBuilder for Service {
        fn on_node(mut self, node: &str) -> Self {
            self.annotations_mut()
                .insert(keys::ANNOTATION_NODE.into(), node.into());
            self
        }
        fn on_interface(mut self, interface: &str) -> Self {
            self.annotations_mut()
                .insert(keys::ANNOTATION_INTERFACE.into(), interface.into());
            self
        }
        fn with_port(mut self, port: i32, protocol: &str) -> Self {
            self.spec
                .get_or_insert_default()
                .ports
                .get_or_insert_default()
                .push(k8s_openapi::api::core::v1::ServicePort {
                    port,
                    protocol: Some(protocol.into()),
                    ..Default::default()
                });
            self
        }
        fn with_ips(mut self, ips: &[&str]) -> Self {
            let ingress = ips
                .iter()
                .map(|ip| LoadBalancerIngress {
                    ip: Some((*ip).into()),
                    ..LoadBalancerIngress::default()
                })
                .collect();
            self.status = Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(ingress),
                }),
                ..ServiceStatus::default()
            });
            self
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn desired(entries: &[(&str, Option<&str>)]) -> DesiredSet {
        entries
            .iter()
            .map(|(i, f)| (ip(i), f.map(str::to_owned)))
            .collect()
    }

    #[test]
    fn only_services_naming_this_node_count() {
        let table = [
            (service("a").with_ips(&["10.0.0.1"]), None),
            (service("b").on_node("other").with_ips(&["10.0.0.1"]), None),
            (service("c").on_node("me"), Some(NodeAssignment::default())),
            (
                service("d").on_node("me").on_interface("eth1").with_ips(&[
                    "10.0.0.1",
                    "fd00::1",
                    "not-an-ip",
                ]),
                Some(NodeAssignment {
                    ips: vec![ip("10.0.0.1"), ip("fd00::1")],
                    interface: Some("eth1".into()),
                    invalid: vec!["not-an-ip".into()],
                    ports: vec![],
                }),
            ),
            (
                service("e")
                    .on_node("me")
                    .on_interface(" ")
                    .with_ips(&["10.0.0.2"]),
                Some(NodeAssignment {
                    ips: vec![ip("10.0.0.2")],
                    ..NodeAssignment::default()
                }),
            ),
        ];
        for (svc, want) in table {
            assert_eq!(assignment_for(&svc, "me"), want, "{}", key_of(&svc));
        }
    }

    #[test]
    fn service_ports_open_on_every_ip_of_the_service_and_sharing_services_add_up() {
        let svc = service("a")
            .on_node("me")
            .with_ips(&["10.0.0.1", "fd00::1"])
            .with_port(80, "TCP")
            .with_port(53, "UDP")
            .with_port(5000, "QUIC");
        let a = assignment_for(&svc, "me").unwrap();
        let tcp80 = OpenPort {
            protocol: Protocol::Tcp,
            port: 80,
        };
        let udp53 = OpenPort {
            protocol: Protocol::Udp,
            port: 53,
        };
        assert_eq!(a.ports, vec![tcp80, udp53]);
        assert_eq!(a.invalid, vec!["port 5000 QUIC".to_owned()]);

        let mut all = Assignments::new("me");
        all.apply(watcher::Event::Init);
        all.apply(watcher::Event::InitApply(svc));
        all.apply(watcher::Event::InitApply(
            service("b")
                .on_node("me")
                .with_ips(&["10.0.0.1"])
                .with_port(443, "SCTP"),
        ));
        all.apply(watcher::Event::InitDone);
        let d = all.desired().unwrap();
        let sctp443 = OpenPort {
            protocol: Protocol::Sctp,
            port: 443,
        };
        assert_eq!(
            d.ports(ip("10.0.0.1")).collect::<Vec<_>>(),
            vec![tcp80, udp53, sctp443]
        );
        assert_eq!(
            d.ports(ip("fd00::1")).collect::<Vec<_>>(),
            vec![tcp80, udp53]
        );
    }

    #[test]
    fn nothing_is_desired_before_the_initial_list_completes() {
        let mut a = Assignments::new("me");
        assert_eq!(a.desired(), None);
        a.apply(watcher::Event::Init);
        a.apply(watcher::Event::InitApply(
            service("a").on_node("me").with_ips(&["10.0.0.1"]),
        ));
        assert_eq!(a.desired(), None);
        assert!(a.apply(watcher::Event::InitDone));
        assert_eq!(a.desired(), Some(desired(&[("10.0.0.1", None)])));
    }

    #[test]
    fn events_add_move_and_remove() {
        let mut a = Assignments::new("me");
        a.apply(watcher::Event::Init);
        a.apply(watcher::Event::InitDone);
        assert_eq!(a.desired(), Some(DesiredSet::new()));

        let svc = service("a").on_node("me").with_ips(&["10.0.0.1"]);
        assert!(a.apply(watcher::Event::Apply(svc.clone())));
        assert!(!a.apply(watcher::Event::Apply(svc.clone())), "same content");
        assert!(
            a.apply(watcher::Event::Apply(
                service("b")
                    .on_node("me")
                    .on_interface("eth1")
                    .with_ips(&["fd00::1"])
            ))
        );
        assert_eq!(
            a.desired(),
            Some(desired(&[("10.0.0.1", None), ("fd00::1", Some("eth1"))]))
        );

        // Moved to another node, then deleted.
        assert!(a.apply(watcher::Event::Apply(svc.clone().on_node("other"))));
        assert!(!a.apply(watcher::Event::Apply(
            service("x").on_node("other").with_ips(&["10.0.0.9"])
        )));
        assert!(
            a.apply(watcher::Event::Delete(
                service("b")
                    .on_node("me")
                    .on_interface("eth1")
                    .with_ips(&["fd00::1"])
            ))
        );
        assert_eq!(a.desired(), Some(DesiredSet::new()));
    }

    #[test]
    fn a_relist_replaces_everything() {
        let mut a = Assignments::new("me");
        a.apply(watcher::Event::Init);
        a.apply(watcher::Event::InitApply(
            service("a").on_node("me").with_ips(&["10.0.0.1"]),
        ));
        a.apply(watcher::Event::InitDone);
        // Service `a` was deleted while the watch was down: the relist does not list it.
        a.apply(watcher::Event::Init);
        a.apply(watcher::Event::InitApply(
            service("b").on_node("me").with_ips(&["10.0.0.2"]),
        ));
        assert_eq!(
            a.desired(),
            Some(desired(&[("10.0.0.1", None)])),
            "old set kept while relisting"
        );
        a.apply(watcher::Event::InitDone);
        assert_eq!(a.desired(), Some(desired(&[("10.0.0.2", None)])));
    }

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut b = WatchBackoff::new();
        let got: Vec<_> = (0..7).map(|_| b.next_delay()).collect();
        assert_eq!(got[0], BACKOFF_MIN);
        assert_eq!(got[1], BACKOFF_MIN * 2);
        assert_eq!(got[6], BACKOFF_MAX);
        b.reset();
        assert_eq!(b.next_delay(), BACKOFF_MIN);
    }
}
