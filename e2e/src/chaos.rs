//! The chaos run: for a bounded time, seeded random actions on the lab (Services created,
//! changed and deleted across several namespaces; pool ConfigMap edits, invalid ones
//! included; controller replicas and agents killed and restarted, agents stopped, nodes
//! cordoned; API-only partitions of a node and of a controller replica; a foreign host
//! taking a pool address; the apiserver restarted once and paused once) while a checker
//! samples the cluster and every node every [`SAMPLE_PERIOD`] and the LAN sampler
//! ([`crate::lan`]) asks who answers ARP for every pool address every 20 ms, then a quiet
//! settle and the invariant verdicts.
//!
//! One holder is judged on the LAN, the truth for a client: at most one MAC answers for an
//! IP in every round, with two bounded exceptions: [`crate::lan::YIELD_BOUND`] after a new
//! holder first shows, and [`ORPHAN_BOUND`] (the aliases' kernel lifetime) for the node of
//! an agent SIGKILLed while its API path was cut: no process is left there to yield, and
//! its last refreshes came after the last renewal the controller saw, so only the kernel
//! ends them. No fault excuses more (the aliases the nodes list are only reported, in a
//! note). A stall of the LAN sampler beyond the yield bound is a violation of its own
//! (`lan-stall`), unless the same single holders answer on both sides and no announcement
//! came in between (see `LanRecord::violations`): what it did not see is not counted as
//! clean.
//!
//! The action sequence is a pure function of the seed ([`ActionPlanner`]): restarts are scheduled
//! a number of actions later, not after a time, so the same seed replays the same sequence
//! (how many actions fit in the duration depends on the machine's speed). The invariants
//! are pure functions of the samples and of the [`Journal`] of what the chaos did, with
//! unit tests below; [`run`] does the I/O (`kubectl`, `curl`, `ip`, `kill`, `scripts/lab`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::Error;
use crate::lab::{LEASE_DURATION, Lab, NODES, SYSTEM_NAMESPACE, ServiceReadback, node_name};
use crate::lan::{LanRecord, LanSampler, LanViolation, Mac};

/// Environment variable: the seed (decimal); a fresh one, printed, when unset.
pub const SEED_ENV: &str = "ALIASLB_CHAOS_SEED";
/// Environment variable: how long the chaos acts, in seconds.
pub const SECONDS_ENV: &str = "ALIASLB_CHAOS_SECONDS";
/// The short form's duration (CI): with the lab's start, settle and teardown it stays
/// under three minutes on the shared 2-core machine.
pub const DEFAULT_SECONDS: u64 = 60;
/// How often the checker samples the Services and the nodes' aliases.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(200);

/// How long the controller may take to react to an edit (of a Service or of the pools)
/// before a state it has to repair counts as a violation. Generous: a loaded 2-core
/// machine, and every reaction is a watch event plus one write.
const REACTION_GRACE: Duration = Duration::from_secs(10);
/// How long no controller may act after a replica is SIGKILLed or the apiserver came
/// back: the leader Lease (15 s) must expire before the other replica takes over, plus
/// its 2 s retry period and some start-up.
const CONTROL_TAKEOVER: Duration = Duration::from_secs(20);
/// How long the apiserver is paused (SIGSTOP) once per run.
const API_PAUSE: Duration = Duration::from_secs(8);
/// No controller is killed this close to the end, so the settle does not wait for a
/// leader takeover.
const NO_CONTROLLER_KILLS_BEFORE_END: Duration = Duration::from_secs(25);
/// After the quiet period, how long the end state may take to converge on a loaded
/// machine before what is left counts.
const SETTLE_MAX: Duration = Duration::from_secs(20);

/// The namespaces the chaos plays in; `chaos-d` has no pool key of its own (it draws from
/// `_fallback`), the others have one unless a pool edit drops it.
const NAMESPACES: [&str; 4] = ["chaos-a", "chaos-b", "chaos-c", "chaos-d"];
/// Service names per namespace.
const SERVICE_NAMES: [&str; 5] = ["svc-0", "svc-1", "svc-2", "svc-3", "svc-4"];
/// Sharing keys the Services pick from.
const SHARING_KEYS: [&str; 2] = ["k1", "k2"];
/// Service ports the Services pick from (sharing Services clash when they pick the same).
const PORTS: [u16; 3] = [80, 81, 82];
/// Controller replicas.
const CONTROLLERS: [u8; 2] = [1, 2];
/// At least this many actions (about 30 s) between two controller kills.
const CONTROLLER_KILL_SPACING: u64 = 60;
/// The `_fallback` pool key.
const FALLBACK: &str = "_fallback";

/// A pool key and the block of LAN addresses (last octet `first..first+len`) its valid
/// edits draw from. Blocks are disjoint: an address can only change namespace through
/// `_fallback` (a key dropped or restored).
#[derive(Debug, Clone, Copy)]
struct Block {
    key: &'static str,
    first: u8,
    len: u8,
}

const BLOCKS: [Block; 4] = [
    Block {
        key: "chaos-a",
        first: 20,
        len: 8,
    },
    Block {
        key: "chaos-b",
        first: 30,
        len: 6,
    },
    Block {
        key: "chaos-c",
        first: 40,
        len: 3,
    },
    Block {
        key: FALLBACK,
        first: 50,
        len: 5,
    },
];

/// The `default` key of `manifests/pools.yaml`, kept as is.
const DEFAULT_POOL: [u8; 3] = [10, 11, 12];

fn lan(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 55, last)
}

/// What a run is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The seed of every random choice.
    pub seed: u64,
    /// How long the chaos acts (the settle and the checks come on top).
    pub duration: Duration,
}

impl Settings {
    /// From [`SEED_ENV`] and [`SECONDS_ENV`]; a fresh seed when unset, [`DEFAULT_SECONDS`]
    /// when no duration is given. A malformed value is an error.
    pub fn from_env() -> Result<Settings, Error> {
        let number = |name: &str| -> Result<Option<u64>, Error> {
            match std::env::var(name) {
                Ok(text) => text.trim().parse().map(Some).map_err(|e| {
                    Error::Environment(format!(
                        "{name}={text:?} is not a non-negative whole number: {e}"
                    ))
                }),
                Err(std::env::VarError::NotPresent) => Ok(None),
                Err(e) => Err(Error::Environment(format!("{name}: {e}"))),
            }
        };
        let seed = match number(SEED_ENV)? {
            Some(seed) => seed,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 % 1_000_000)
                .unwrap_or(1),
        };
        let seconds = number(SECONDS_ENV)?.unwrap_or(DEFAULT_SECONDS);
        if seconds == 0 {
            return Err(Error::Environment(format!(
                "{SECONDS_ENV}=0: the chaos needs at least one second"
            )));
        }
        Ok(Settings {
            seed,
            duration: Duration::from_secs(seconds),
        })
    }
}

/// SplitMix64: a tiny, fixed generator, so a seed means the same sequence in every build
/// (a crate's generator may change its stream between versions).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0; the modulo bias is negligible for small `n`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `percent` / 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One element of a non-empty slice.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// A valid pool configuration: key -> addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pools(BTreeMap<String, BTreeSet<Ipv4Addr>>);

impl Pools {
    /// Every block in full, plus `default`.
    fn initial() -> Pools {
        let mut pools = Pools::default();
        for b in BLOCKS {
            pools.0.insert(
                b.key.to_owned(),
                (b.first..b.first + b.len).map(lan).collect(),
            );
        }
        pools.0.insert(
            "default".to_owned(),
            DEFAULT_POOL.into_iter().map(lan).collect(),
        );
        pools
    }

    /// The pool namespace `ns` draws from: its own key, else `_fallback`.
    pub fn pool_of(&self, ns: &str) -> Option<&BTreeSet<Ipv4Addr>> {
        self.0.get(ns).or_else(|| self.0.get(FALLBACK))
    }
}

/// The spec of one chaos Service, as the chaos intends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spec {
    port: u16,
    key: Option<&'static str>,
    request: Option<Ipv4Addr>,
    local: bool,
    load_balancer: bool,
}

/// One change to an existing Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Port(u16),
    Request(Option<Ipv4Addr>),
    Key(Option<&'static str>),
    Local(bool),
    ToClusterIp,
    ToLoadBalancer,
}

/// One chaos action.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Create(&'static str, &'static str, Spec),
    Change(&'static str, &'static str, Change),
    Delete(&'static str, &'static str),
    /// The full `data` of the pool ConfigMap, and the config it means when valid.
    Pools(BTreeMap<String, String>, Option<Pools>),
    KillController(u8),
    StartController(u8),
    KillAgent(u8),
    TermAgent(u8),
    StartAgent(u8),
    Cordon(u8),
    Uncordon(u8),
    RestartApiserver,
    /// SIGSTOP of kube-apiserver for the duration, then SIGCONT.
    PauseApiserver(Duration),
    /// API-only partition of a node (both directions; LAN untouched).
    PartitionNode(u8),
    HealNode(u8),
    /// A controller replica's API path cut.
    PartitionController(u8),
    HealController(u8),
    /// A foreign host on the LAN configures and announces this pool address.
    Rogue(Ipv4Addr),
    RemoveRogue,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Create(ns, name, s) => write!(f, "create {ns}/{name} {s:?}"),
            Action::Change(ns, name, c) => write!(f, "change {ns}/{name} {c:?}"),
            Action::Delete(ns, name) => write!(f, "delete {ns}/{name}"),
            Action::Pools(data, valid) => {
                let keys: Vec<String> = data
                    .iter()
                    .map(|(k, v)| format!("{k}=[{}]", v.replace('\n', " ")))
                    .collect();
                let what = if valid.is_some() { "valid" } else { "INVALID" };
                write!(f, "pools ({what}) {}", keys.join(" "))
            }
            Action::KillController(i) => write!(f, "SIGKILL controller-{i}"),
            Action::StartController(i) => write!(f, "start controller-{i}"),
            Action::KillAgent(n) => write!(f, "SIGKILL agent-{n}"),
            Action::TermAgent(n) => write!(f, "SIGTERM agent-{n}"),
            Action::StartAgent(n) => write!(f, "start agent-{n}"),
            Action::Cordon(n) => write!(f, "cordon {}", node_name(*n)),
            Action::Uncordon(n) => write!(f, "uncordon {}", node_name(*n)),
            Action::RestartApiserver => write!(f, "restart kube-apiserver"),
            Action::PauseApiserver(d) => write!(f, "pause kube-apiserver {} s", d.as_secs()),
            Action::PartitionNode(n) => write!(f, "API-partition {}", node_name(*n)),
            Action::HealNode(n) => write!(f, "heal {}'s API path", node_name(*n)),
            Action::PartitionController(i) => write!(f, "API-partition controller-{i}"),
            Action::HealController(i) => write!(f, "heal controller-{i}'s API path"),
            Action::Rogue(ip) => write!(f, "foreign host takes {ip}"),
            Action::RemoveRogue => write!(f, "foreign host leaves"),
        }
    }
}

/// The seeded action generator and the intended state it keeps (no I/O: the sequence
/// depends on the seed only).
#[derive(Debug, Clone)]
pub struct ActionPlanner {
    rng: Rng,
    index: u64,
    services: BTreeMap<(&'static str, &'static str), Spec>,
    pools: Pools,
    agents_down: BTreeSet<u8>,
    controllers_down: BTreeSet<u8>,
    cordoned: BTreeSet<u8>,
    /// Nodes cut from the API.
    partitioned: BTreeSet<u8>,
    /// Controller replicas cut from the API.
    controllers_cut: BTreeSet<u8>,
    /// The address a foreign host holds.
    rogue: Option<Ipv4Addr>,
    /// (action index it is due at, the restart).
    restarts: Vec<(u64, Action)>,
    /// Action index of the last controller kill.
    last_controller_kill: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Create,
    Change,
    Delete,
    PoolsValid,
    PoolsInvalid,
    KillController,
    KillAgent,
    TermAgent,
    Cordon,
    Uncordon,
    PartitionNode,
    PartitionController,
    Rogue,
}

impl ActionPlanner {
    /// A planner seeded with `seed`, starting from the lab's state after [`prepare`].
    pub fn new(seed: u64) -> ActionPlanner {
        ActionPlanner {
            rng: Rng::new(seed),
            index: 0,
            services: BTreeMap::new(),
            pools: Pools::initial(),
            agents_down: BTreeSet::new(),
            controllers_down: BTreeSet::new(),
            cordoned: BTreeSet::new(),
            partitioned: BTreeSet::new(),
            controllers_cut: BTreeSet::new(),
            rogue: None,
            restarts: Vec::new(),
            last_controller_kill: None,
        }
    }

    /// The next action; `controller_kills` false keeps both replicas alive (near the end).
    fn next(&mut self, controller_kills: bool) -> Action {
        self.index += 1;
        if let Some(pos) = self.restarts.iter().position(|(due, _)| *due <= self.index) {
            let (_, action) = self.restarts.remove(pos);
            match &action {
                Action::StartAgent(n) => self.agents_down.remove(n),
                Action::StartController(i) => self.controllers_down.remove(i),
                Action::HealNode(n) => self.partitioned.remove(n),
                Action::HealController(i) => self.controllers_cut.remove(i),
                Action::RemoveRogue => self.rogue.take().is_some(),
                _ => false,
            };
            return action;
        }
        let free = self.free_names();
        let mut kinds: Vec<(u64, Kind)> = vec![(6, Kind::PoolsValid), (3, Kind::PoolsInvalid)];
        if !free.is_empty() {
            kinds.push((14, Kind::Create));
        }
        if !self.services.is_empty() {
            kinds.push((30, Kind::Change));
            kinds.push((6, Kind::Delete));
        }
        if self.agents_down.len() < 2 {
            kinds.push((3, Kind::KillAgent));
            kinds.push((3, Kind::TermAgent));
        }
        // Each controller kill stops all judging of the controller's reactions for the
        // leader takeover: keep quiet stretches between them.
        let kill_spaced = self
            .last_controller_kill
            .is_none_or(|last| self.index >= last + CONTROLLER_KILL_SPACING);
        if controller_kills
            && kill_spaced
            && self.controllers_down.is_empty()
            && self.controllers_cut.is_empty()
        {
            kinds.push((2, Kind::KillController));
            kinds.push((1, Kind::PartitionController));
        }
        // At least one node keeps both its agent and its API path.
        if self.partitioned.is_empty() && self.agents_down.len() < 2 {
            kinds.push((2, Kind::PartitionNode));
        }
        if self.rogue.is_none() {
            kinds.push((1, Kind::Rogue));
        }
        if self.cordoned.len() < 2 {
            kinds.push((3, Kind::Cordon));
        }
        if !self.cordoned.is_empty() {
            kinds.push((4, Kind::Uncordon));
        }
        let total: u64 = kinds.iter().map(|(w, _)| w).sum();
        let mut draw = self.rng.below(total);
        let kind = kinds
            .iter()
            .find(|(w, _)| {
                let hit = draw < *w;
                draw = draw.saturating_sub(*w);
                hit
            })
            .map(|(_, k)| *k)
            .unwrap_or(Kind::PoolsValid);
        match kind {
            Kind::Create => {
                let (ns, name) = self.rng.pick(&free);
                let spec = self.random_spec(ns);
                self.services.insert((ns, name), spec);
                Action::Create(ns, name, spec)
            }
            Kind::Change => self.random_change(),
            Kind::Delete => {
                let existing: Vec<_> = self.services.keys().copied().collect();
                let (ns, name) = self.rng.pick(&existing);
                self.services.remove(&(ns, name));
                Action::Delete(ns, name)
            }
            Kind::PoolsValid => {
                let pools = self.random_pools();
                let data = self.render(&pools);
                self.pools = pools.clone();
                Action::Pools(data, Some(pools))
            }
            Kind::PoolsInvalid => {
                let pools = self.random_pools();
                let mut data = self.render(&pools);
                self.corrupt(&mut data);
                Action::Pools(data, None)
            }
            Kind::KillController => {
                let i = self.rng.pick(&CONTROLLERS);
                self.controllers_down.insert(i);
                self.last_controller_kill = Some(self.index);
                self.schedule(Action::StartController(i));
                Action::KillController(i)
            }
            Kind::KillAgent | Kind::TermAgent => {
                let up: Vec<u8> = NODES
                    .into_iter()
                    .filter(|n| !self.agents_down.contains(n))
                    .collect();
                let n = self.rng.pick(&up);
                self.agents_down.insert(n);
                self.schedule(Action::StartAgent(n));
                if kind == Kind::KillAgent {
                    Action::KillAgent(n)
                } else {
                    Action::TermAgent(n)
                }
            }
            Kind::Cordon => {
                let up: Vec<u8> = NODES
                    .into_iter()
                    .filter(|n| !self.cordoned.contains(n))
                    .collect();
                let n = self.rng.pick(&up);
                self.cordoned.insert(n);
                Action::Cordon(n)
            }
            Kind::Uncordon => {
                let cordoned: Vec<u8> = self.cordoned.iter().copied().collect();
                let n = self.rng.pick(&cordoned);
                self.cordoned.remove(&n);
                Action::Uncordon(n)
            }
            Kind::PartitionNode => {
                let n = self.rng.pick(&NODES);
                self.partitioned.insert(n);
                self.schedule(Action::HealNode(n));
                Action::PartitionNode(n)
            }
            Kind::PartitionController => {
                let i = self.rng.pick(&CONTROLLERS);
                self.controllers_cut.insert(i);
                self.last_controller_kill = Some(self.index);
                self.schedule(Action::HealController(i));
                Action::PartitionController(i)
            }
            Kind::Rogue => {
                let b = self.rng.pick(&BLOCKS);
                let ip = lan(b.first + self.rng.below(u64::from(b.len)) as u8);
                self.rogue = Some(ip);
                self.schedule(Action::RemoveRogue);
                Action::Rogue(ip)
            }
        }
    }

    fn free_names(&self) -> Vec<(&'static str, &'static str)> {
        NAMESPACES
            .into_iter()
            .flat_map(|ns| SERVICE_NAMES.into_iter().map(move |name| (ns, name)))
            .filter(|k| !self.services.contains_key(k))
            .collect()
    }

    fn schedule(&mut self, restart: Action) {
        let due = self.index + 3 + self.rng.below(12);
        self.restarts.push((due, restart));
    }

    /// A requested IP: mostly from the namespace's own block, sometimes another tenant's.
    fn random_request(&mut self, ns: &str) -> Option<Ipv4Addr> {
        if !self.rng.percent(20) {
            return None;
        }
        let own = BLOCKS.iter().find(|b| b.key == ns).copied();
        let block = match own {
            Some(b) if self.rng.percent(70) => b,
            _ => self.rng.pick(&BLOCKS),
        };
        Some(lan(block.first + self.rng.below(u64::from(block.len)) as u8))
    }

    fn random_key(&mut self) -> Option<&'static str> {
        if self.rng.percent(50) {
            None
        } else {
            Some(self.rng.pick(&SHARING_KEYS))
        }
    }

    fn random_spec(&mut self, ns: &str) -> Spec {
        Spec {
            port: self.rng.pick(&PORTS),
            key: self.random_key(),
            request: self.random_request(ns),
            local: self.rng.percent(30),
            load_balancer: true,
        }
    }

    fn random_change(&mut self) -> Action {
        let existing: Vec<_> = self.services.keys().copied().collect();
        let (ns, name) = self.rng.pick(&existing);
        let spec = self.services[&(ns, name)];
        let change = match self.rng.below(6) {
            0 => Change::Port(self.rng.pick(&PORTS)),
            1 => Change::Request(self.random_request(ns)),
            2 => Change::Key(self.random_key()),
            3 if spec.load_balancer => Change::Local(!spec.local),
            _ if spec.load_balancer => Change::ToClusterIp,
            _ => Change::ToLoadBalancer,
        };
        let spec = self
            .services
            .get_mut(&(ns, name))
            .expect("picked from the keys");
        match change {
            Change::Port(p) => spec.port = p,
            Change::Request(r) => spec.request = r,
            Change::Key(k) => spec.key = k,
            Change::Local(l) => spec.local = l,
            Change::ToClusterIp => spec.load_balancer = false,
            Change::ToLoadBalancer => spec.load_balancer = true,
        }
        Action::Change(ns, name, change)
    }

    /// Each block key present with 85 % probability, holding a random non-empty run of
    /// its block; `default` as shipped.
    fn random_pools(&mut self) -> Pools {
        let mut pools = Pools::default();
        for b in BLOCKS {
            if !self.rng.percent(85) {
                continue;
            }
            let start = self.rng.below(u64::from(b.len)) as u8;
            let len = 1 + self.rng.below(u64::from(b.len - start)) as u8;
            let first = b.first + start;
            pools
                .0
                .insert(b.key.to_owned(), (first..first + len).map(lan).collect());
        }
        pools.0.insert(
            "default".to_owned(),
            DEFAULT_POOL.into_iter().map(lan).collect(),
        );
        pools
    }

    /// The ConfigMap text of `pools`, in the format's several spellings (one address per
    /// line, an inclusive range, comments).
    fn render(&mut self, pools: &Pools) -> BTreeMap<String, String> {
        pools
            .0
            .iter()
            .map(|(key, ips)| {
                let first = ips.first().expect("valid pools have no empty key");
                let last = ips.last().expect("valid pools have no empty key");
                let mut text = String::new();
                if self.rng.percent(20) {
                    text.push_str("# chaos edit\n");
                }
                if ips.len() > 1 && self.rng.percent(50) {
                    text.push_str(&format!("{first}-{last}\n"));
                } else {
                    for ip in ips {
                        text.push_str(&format!("{ip}\n"));
                    }
                }
                (key.clone(), text)
            })
            .collect()
    }

    /// Breaks `data` in one of the ways the format forbids.
    fn corrupt(&mut self, data: &mut BTreeMap<String, String>) {
        let keys: Vec<String> = data.keys().cloned().collect();
        let key = keys[self.rng.below(keys.len() as u64) as usize].clone();
        let other = keys.iter().find(|k| **k != key).cloned();
        match self.rng.below(6) {
            0 => data.entry(key).or_default().push_str("192.168.55.300\n"),
            1 => match other.and_then(|o| data[&o].lines().last().map(str::to_owned)) {
                // A duplicate across keys (the last line of another key: an address, or
                // a range overlapping it).
                Some(line) => data.entry(key).or_default().push_str(&format!("{line}\n")),
                None => data.entry(key).or_default().push_str("192.168.55.20/33\n"),
            },
            2 => {
                data.insert(key, String::new());
            }
            3 => data.entry(key).or_default().push_str("127.0.0.1\n"),
            4 => data.entry(key).or_default().push_str("192.168.55.21/29\n"),
            _ => {
                data.insert("Chaos-A".to_owned(), "192.168.55.60\n".to_owned());
            }
        }
    }
}

/// What the chaos did, with offsets from the start of the run: the checker's verdicts are
/// judged against it.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    /// Valid pool configs: (edit started, edit done, config), in order; the first is the
    /// config at the start.
    configs: Vec<(Duration, Duration, Pools)>,
    /// Service edits (create, change, delete): (ns, name) -> (started, done).
    edits: BTreeMap<(String, String), Vec<(Duration, Duration)>>,
    /// Spans in which no controller may be leading (a replica SIGKILLed, the apiserver
    /// restarting), ends included [`CONTROL_TAKEOVER`].
    gaps: Vec<(Duration, Duration)>,
    /// Agents SIGKILLed while their node's API path was cut: (node name, when). Their
    /// aliases were refreshed after the last renewal the controller saw, so they outlive
    /// the controller's deadline by up to the time between that renewal and the kill, and
    /// no process is left to yield them: only the kernel lifetime ends them.
    orphans: Vec<(String, Duration)>,
    /// MACs of the foreign hosts the chaos put on the LAN. A foreign host answering for an
    /// address a node holds is a conflict the cluster shows (Announced `AddressDefended`)
    /// and defends against but cannot silence; one holder is judged among the nodes.
    foreign: BTreeSet<Mac>,
}

/// How long after the SIGKILL of a cut-off agent its node may still answer for its IPs:
/// the aliases' kernel lifetime (less than the lease duration), plus the yield bound.
/// The one window the LAN checker excuses besides the yield bound itself, and only for
/// the killed node's MAC; bounded by the kernel, not by anything the agent does.
pub const ORPHAN_BOUND: Duration = LEASE_DURATION.saturating_add(crate::lan::YIELD_BOUND);

impl Journal {
    /// Whether `node` may still answer at `t` as the orphan of a cut-off agent's SIGKILL.
    fn orphaned(&self, node: &str, t: Duration) -> bool {
        self.orphans
            .iter()
            .any(|(n, killed)| n == node && *killed <= t && t <= *killed + ORPHAN_BOUND)
    }

    /// Whether the controller may still be reacting at `t` to something done at `done`:
    /// within [`REACTION_GRACE`], stretched by any control gap overlapping that time.
    fn unreacted(&self, done: Duration, t: Duration) -> bool {
        let mut deadline = done + REACTION_GRACE;
        let mut gaps = self.gaps.clone();
        gaps.sort();
        for (start, end) in gaps {
            if start <= deadline && end + REACTION_GRACE > deadline && end >= done {
                deadline = end + REACTION_GRACE;
            }
        }
        t < deadline
    }

    /// The configs the controller may be acting on at `t`: the newest one started by then,
    /// and older ones while their successors are unreacted.
    fn configs_at(&self, t: Duration) -> Vec<&Pools> {
        let Some(newest) = self.configs.iter().rposition(|(start, _, _)| *start <= t) else {
            return self.configs.iter().take(1).map(|(_, _, p)| p).collect();
        };
        let mut out = vec![&self.configs[newest].2];
        let mut k = newest;
        while k > 0 && self.unreacted(self.configs[k].1, t) {
            k -= 1;
            out.push(&self.configs[k].2);
        }
        out
    }

    /// Whether an edit of `ns/name` is still unreacted at `t`.
    fn recently_edited(&self, ns: &str, name: &str, t: Duration) -> bool {
        self.edits
            .get(&(ns.to_owned(), name.to_owned()))
            .into_iter()
            .flatten()
            .any(|(start, done)| *start <= t && self.unreacted(*done, t))
    }

    /// The last valid config.
    fn final_pools(&self) -> Option<&Pools> {
        self.configs.last().map(|(_, _, p)| p)
    }
}

/// A Service as the checker saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSeen {
    /// Namespace.
    pub ns: String,
    /// Name.
    pub name: String,
    /// `type: LoadBalancer` of aliaslb's class (or none).
    pub load_balancer: bool,
    /// The `aliaslb.io/sharing-key` annotation.
    pub sharing_key: Option<String>,
    /// What aliaslb wrote.
    pub view: ServiceReadback,
}

impl ServiceSeen {
    fn from_json(v: &Value) -> ServiceSeen {
        let text = |p: &Value| p.as_str().map(str::to_owned);
        let class = v["spec"]["loadBalancerClass"].as_str();
        ServiceSeen {
            ns: text(&v["metadata"]["namespace"]).unwrap_or_default(),
            name: text(&v["metadata"]["name"]).unwrap_or_default(),
            load_balancer: v["spec"]["type"].as_str() == Some("LoadBalancer")
                && class.is_none_or(|c| c == aliaslb_class()),
            sharing_key: text(&v["metadata"]["annotations"]["aliaslb.io/sharing-key"]),
            view: ServiceReadback::from_json(v),
        }
    }

    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }
}

fn aliaslb_class() -> &'static str {
    "aliaslb.io/alias"
}

/// One look at the cluster and at every node; `None` where the read failed (the apiserver
/// restarting).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Offset from the start of the run.
    pub at: Duration,
    /// Every Service in the cluster.
    pub services: Option<Vec<ServiceSeen>>,
    /// The /32 aliases on each node's `eth0`.
    pub nodes: Option<BTreeMap<u8, BTreeSet<Ipv4Addr>>>,
}

/// The invariants, as counted in the summary line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// An IP on two Services that may not share it.
    DoubleAssign,
    /// An IP outside its namespace's pool.
    OutsidePool,
    /// Two or more MACs answering ARP for an IP on the LAN, beyond the yield bound after
    /// a new holder first showed.
    LanDouble,
    /// The LAN sampler stalled beyond the yield bound: a stretch nobody looked at.
    LanStall,
    /// An alias on a node that is not its Service's holder, after the settle.
    StrayAlias,
    /// A LoadBalancer Service without IP and without a reason, while its pool has room.
    SilentPending,
    /// A panic in a log, or a process that died without the chaos killing it.
    Panics,
}

impl Invariant {
    const ALL: [Invariant; 7] = [
        Invariant::DoubleAssign,
        Invariant::OutsidePool,
        Invariant::LanDouble,
        Invariant::LanStall,
        Invariant::StrayAlias,
        Invariant::SilentPending,
        Invariant::Panics,
    ];

    fn label(self) -> &'static str {
        match self {
            Invariant::DoubleAssign => "double-assign",
            Invariant::OutsidePool => "outside-pool",
            Invariant::LanDouble => "lan-double",
            Invariant::LanStall => "lan-stall",
            Invariant::StrayAlias => "stray-alias",
            Invariant::SilentPending => "silent-pending",
            Invariant::Panics => "panics",
        }
    }
}

/// One violation: which invariant, when, about what (counted once per subject), and the
/// offending sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offence {
    /// The invariant.
    pub invariant: Invariant,
    /// Offset from the start of the run.
    pub at: Duration,
    /// What it is about (an IP and Services, a node, a process); the count is per subject.
    pub subject: String,
    /// The offending sample.
    pub detail: String,
}

/// Double assignments in one sample: an IP on two LoadBalancer Services that may not
/// share it (other namespaces, or other/no sharing keys). Across namespaces it is never
/// excused; in one namespace only while an edit of either Service is unreacted (a sharer
/// whose key just changed).
fn double_assignments(services: &[ServiceSeen], at: Duration, journal: &Journal) -> Vec<Offence> {
    let mut by_ip: BTreeMap<Ipv4Addr, Vec<&ServiceSeen>> = BTreeMap::new();
    for s in services.iter().filter(|s| s.load_balancer) {
        for ip in &s.view.ips {
            by_ip.entry(*ip).or_default().push(s);
        }
    }
    let mut out = Vec::new();
    for (ip, holders) in by_ip {
        for (i, a) in holders.iter().enumerate() {
            for b in &holders[i + 1..] {
                let permitted =
                    a.ns == b.ns && a.sharing_key.is_some() && a.sharing_key == b.sharing_key;
                if permitted {
                    continue;
                }
                let excused = a.ns == b.ns
                    && (journal.recently_edited(&a.ns, &a.name, at)
                        || journal.recently_edited(&b.ns, &b.name, at));
                if !excused {
                    out.push(Offence {
                        invariant: Invariant::DoubleAssign,
                        at,
                        subject: format!("{ip} {} {}", a.key(), b.key()),
                        detail: format!(
                            "{ip} on {} (key {:?}) and {} (key {:?})",
                            a.key(),
                            a.sharing_key,
                            b.key(),
                            b.sharing_key
                        ),
                    });
                }
            }
        }
    }
    out
}

/// IPs outside the pool of their Service's namespace in every config the controller may
/// be acting on.
fn outside_pool(services: &[ServiceSeen], at: Duration, journal: &Journal) -> Vec<Offence> {
    let configs = journal.configs_at(at);
    let mut out = Vec::new();
    for s in services.iter().filter(|s| s.load_balancer) {
        for ip in &s.view.ips {
            let allowed = configs
                .iter()
                .any(|c| c.pool_of(&s.ns).is_some_and(|p| p.contains(ip)));
            if !allowed {
                out.push(Offence {
                    invariant: Invariant::OutsidePool,
                    at,
                    subject: format!("{ip} {}", s.key()),
                    detail: format!(
                        "{ip} on {} is in no pool of {} in force (configs considered: {:?})",
                        s.key(),
                        s.ns,
                        configs.iter().map(|c| c.pool_of(&s.ns)).collect::<Vec<_>>()
                    ),
                });
            }
        }
    }
    out
}

/// IPs listed on two nodes' `eth0` at once (informational: the one-holder invariant is
/// judged on the LAN, where an alias the kernel no longer answers for does no harm and one
/// on a node that lost its carrier is not seen).
fn alias_doubles(nodes: &BTreeMap<u8, BTreeSet<Ipv4Addr>>) -> BTreeSet<Ipv4Addr> {
    let ips: BTreeSet<Ipv4Addr> = nodes.values().flatten().copied().collect();
    ips.into_iter()
        .filter(|ip| nodes.values().filter(|held| held.contains(ip)).count() > 1)
        .collect()
}

/// The one-holder verdicts of the LAN sampler, as offences at offsets from `t0`: one
/// subject per IP for doubles, one per stall.
fn lan_offences(
    record: &LanRecord,
    t0: Instant,
    names: &BTreeMap<Mac, String>,
    journal: &Journal,
) -> Vec<Offence> {
    record
        .violations()
        .into_iter()
        .filter(|v| match v {
            LanViolation::Double { at, macs, .. } => {
                let t = at.saturating_duration_since(t0);
                let nodes = macs.iter().filter(|m| !journal.foreign.contains(m)).count();
                nodes > 1
                    && !macs
                        .iter()
                        .any(|m| names.get(m).is_some_and(|node| journal.orphaned(node, t)))
            }
            LanViolation::Stall { .. } => true,
        })
        .map(|v| {
            let at = v.at().saturating_duration_since(t0);
            let (invariant, subject) = match &v {
                LanViolation::Double { ip, .. } => (Invariant::LanDouble, ip.to_string()),
                LanViolation::Stall { .. } => (
                    Invariant::LanStall,
                    format!("LAN sampler stalled at {:.3}s", at.as_secs_f64()),
                ),
            };
            Offence {
                invariant,
                at,
                subject,
                detail: v.describe(t0, names),
            }
        })
        .collect()
}

/// Aliases on a node that no LoadBalancer Service assigns to that node.
fn stray_aliases(
    services: &[ServiceSeen],
    nodes: &BTreeMap<u8, BTreeSet<Ipv4Addr>>,
    at: Duration,
) -> Vec<Offence> {
    let mut out = Vec::new();
    for (n, held) in nodes {
        for ip in held {
            let owner = services.iter().find(|s| {
                s.load_balancer
                    && s.view.ips.contains(ip)
                    && s.view.node.as_deref() == Some(node_name(*n).as_str())
            });
            if owner.is_none() {
                let claims: Vec<String> = services
                    .iter()
                    .filter(|s| s.view.ips.contains(ip))
                    .map(|s| format!("{} ({})", s.key(), s.view.summary()))
                    .collect();
                out.push(Offence {
                    invariant: Invariant::StrayAlias,
                    at,
                    subject: format!("{ip} on {}", node_name(*n)),
                    detail: format!(
                        "{ip} on {} but no LoadBalancer Service assigns it there; Services with it: {claims:?}",
                        node_name(*n)
                    ),
                });
            }
        }
    }
    out
}

/// LoadBalancer Services without an IP and without an `IPAllocated=False` reason while
/// their namespace's pool has a free address.
fn silent_pending(services: &[ServiceSeen], pools: &Pools, at: Duration) -> Vec<Offence> {
    let used: BTreeSet<Ipv4Addr> = services
        .iter()
        .filter(|s| s.load_balancer)
        .flat_map(|s| s.view.ips.iter().copied())
        .collect();
    services
        .iter()
        .filter(|s| s.load_balancer && s.view.ips.is_empty())
        .filter(|s| {
            !s.view
                .conditions
                .get("aliaslb.io/IPAllocated")
                .is_some_and(|c| c.status == "False" && !c.reason.is_empty())
        })
        .filter(|s| {
            pools
                .pool_of(&s.ns)
                .is_some_and(|p| p.iter().any(|ip| !used.contains(ip)))
        })
        .map(|s| Offence {
            invariant: Invariant::SilentPending,
            at,
            subject: s.key(),
            detail: format!(
                "{} has no IP and no reason while its pool {:?} has room: {}",
                s.key(),
                pools.pool_of(&s.ns),
                s.view.summary()
            ),
        })
        .collect()
}

/// The Service invariants (double assignments, outside the pool) over every sample.
fn judge_samples(samples: &[Snapshot], journal: &Journal) -> Vec<Offence> {
    let mut out = Vec::new();
    for s in samples {
        if let Some(services) = &s.services {
            out.extend(double_assignments(services, s.at, journal));
            out.extend(outside_pool(services, s.at, journal));
        }
    }
    out
}

/// What the samples show the chaos exercised, so a clean run can be told from an idle one.
fn coverage(samples: &[Snapshot]) -> String {
    let mut assignments = BTreeSet::new();
    let mut shared = BTreeSet::new();
    let mut placements: BTreeMap<Ipv4Addr, BTreeSet<u8>> = BTreeMap::new();
    for s in samples {
        let lb: Vec<&ServiceSeen> = s
            .services
            .iter()
            .flatten()
            .filter(|o| o.load_balancer)
            .collect();
        for o in &lb {
            for ip in &o.view.ips {
                assignments.insert((o.key(), *ip));
                if lb.iter().filter(|p| p.view.ips.contains(ip)).count() > 1 {
                    shared.insert(*ip);
                }
            }
        }
        for (n, held) in s.nodes.iter().flatten() {
            for ip in held {
                placements.entry(*ip).or_default().insert(*n);
            }
        }
    }
    let moved = placements.values().filter(|nodes| nodes.len() > 1).count();
    format!(
        "coverage: {} distinct (Service, IP) assignments, {} IPs shared by two Services at once, \
         {} IPs announced, {moved} of them on more than one node over the run",
        assignments.len(),
        shared.len(),
        placements.len()
    )
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The chaos duration asked for.
    pub duration: Duration,
    /// Actions performed.
    pub actions: u64,
    /// Actions whose command failed even after a retry (listed in `notes`).
    pub failed_actions: u64,
    /// Samples taken (with a Service list, with node aliases).
    pub samples: (usize, usize),
    /// Every violation.
    pub offences: Vec<Offence>,
    /// Observations that are not violations (timings, failed actions).
    pub notes: Vec<String>,
}

impl Report {
    /// Violations of `invariant`, counted once per subject.
    pub fn count(&self, invariant: Invariant) -> usize {
        self.offences
            .iter()
            .filter(|o| o.invariant == invariant)
            .map(|o| &o.subject)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// Whether every count is 0.
    pub fn is_clean(&self) -> bool {
        self.offences.is_empty()
    }

    /// The one summary line.
    pub fn summary(&self) -> String {
        let counts: Vec<String> = Invariant::ALL
            .iter()
            .map(|i| format!("{}={}", i.label(), self.count(*i)))
            .collect();
        format!(
            "chaos: seed={} duration={}s actions={} violations: {}",
            self.seed,
            self.duration.as_secs(),
            self.actions,
            counts.join(" ")
        )
    }

    /// The first offending samples of each violated subject, and the notes.
    pub fn details(&self) -> String {
        let mut seen = BTreeSet::new();
        let mut lines = Vec::new();
        for o in &self.offences {
            if seen.insert((o.invariant, o.subject.clone())) {
                let n = self
                    .offences
                    .iter()
                    .filter(|p| p.invariant == o.invariant && p.subject == o.subject)
                    .count();
                lines.push(format!(
                    "{} at {:.1}s ({n} samples): {}",
                    o.invariant.label(),
                    o.at.as_secs_f64(),
                    o.detail
                ));
            }
        }
        lines.extend(self.notes.iter().map(|n| format!("note: {n}")));
        lines.join("\n")
    }
}

/// The checker: samples every [`SAMPLE_PERIOD`] on a background thread.
#[derive(Debug)]
struct Checker {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Snapshot>>,
}

impl Checker {
    fn start(api: Api, t0: Instant) -> Checker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut next = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                samples.push(snapshot(&api, t0));
                next += SAMPLE_PERIOD;
                match next.checked_duration_since(Instant::now()) {
                    Some(wait) => std::thread::sleep(wait),
                    None => next = Instant::now(),
                }
            }
            samples
        });
        Checker { stop, thread }
    }

    fn finish(self) -> Result<Vec<Snapshot>, Error> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| Error::Environment("the chaos checker thread panicked".to_owned()))
    }
}

/// Reads the Service list straight from the apiserver with `curl` (much lighter than
/// `kubectl` at five reads a second on a 2-core machine).
#[derive(Debug, Clone)]
struct Api {
    server: String,
    ca: String,
    token: String,
}

impl Api {
    /// From the lab's admin kubeconfig (`server:`, `certificate-authority:`, `token:`).
    fn from_kubeconfig(path: &Path) -> Result<Api, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            what: format!("reading {}", path.display()),
            source,
        })?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_owned()))
                .ok_or_else(|| Error::Output {
                    cmd: format!("reading {}", path.display()),
                    why: format!("no `{name}` line"),
                })
        };
        Ok(Api {
            server: field("server:")?,
            ca: field("certificate-authority:")?,
            token: field("token:")?,
        })
    }

    fn services(&self) -> Result<Vec<ServiceSeen>, Error> {
        let out = crate::lab::run(Command::new("curl").args([
            "-sS",
            "--fail",
            "--max-time",
            "3",
            "--cacert",
            &self.ca,
            "-H",
            &format!("Authorization: Bearer {}", self.token),
            &format!("{}/api/v1/services", self.server),
        ]))?;
        let list: Value = serde_json::from_str(&out).map_err(|e| Error::Output {
            cmd: "GET /api/v1/services".to_owned(),
            why: format!("not JSON: {e}"),
        })?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(ServiceSeen::from_json)
            .collect())
    }
}

/// The aliases of every node, read 1, 2, 3, 3, 2, 1 and kept only where both reads agree
/// (as [`crate::sampler`] does): two nodes counted as holders held the IP at one instant.
fn node_aliases() -> Result<BTreeMap<u8, BTreeSet<Ipv4Addr>>, Error> {
    let mut first = BTreeMap::new();
    for n in NODES {
        first.insert(n, crate::aliases(n)?);
    }
    let mut held = BTreeMap::new();
    for n in NODES.into_iter().rev() {
        let again = crate::aliases(n)?;
        held.insert(n, first[&n].intersection(&again).copied().collect());
    }
    Ok(held)
}

fn snapshot(api: &Api, t0: Instant) -> Snapshot {
    let services = api.services().ok();
    let at = t0.elapsed();
    let nodes = node_aliases().ok();
    Snapshot {
        at,
        services,
        nodes,
    }
}

/// The processes the chaos manages, and where the lab keeps their pid files and logs.
#[derive(Debug)]
struct Processes {
    state: PathBuf,
    /// Names expected to run.
    up: BTreeSet<String>,
}

impl Processes {
    fn alive(&self, name: &str) -> bool {
        let pid = std::fs::read_to_string(self.state.join(format!("pids/{name}.pid")))
            .unwrap_or_default();
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
        !pid.trim().is_empty() && !stat.is_empty() && stat.split_whitespace().nth(2) != Some("Z")
    }

    /// Processes expected up that are gone: crashes (the chaos did not kill them).
    fn dead(&self) -> Vec<String> {
        self.up.iter().filter(|n| !self.alive(n)).cloned().collect()
    }

    /// Lines containing `panicked` in the agents' and controllers' logs.
    fn panics(&self) -> Vec<String> {
        let mut out = Vec::new();
        let entries = std::fs::read_dir(self.state.join("logs"))
            .into_iter()
            .flatten()
            .flatten();
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("agent-") || name.starts_with("controller-")) {
                continue;
            }
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            out.extend(
                text.lines()
                    .filter(|l| l.contains("panicked"))
                    .map(|l| format!("{name}: {l}")),
            );
        }
        out
    }
}

/// Runs `f`, once more after a second if it fails (a loaded apiserver may time out).
fn retry<T>(mut f: impl FnMut() -> Result<T, Error>) -> Result<T, Error> {
    f().or_else(|_| {
        std::thread::sleep(Duration::from_secs(1));
        f()
    })
}

fn service_json(ns: &str, name: &str, spec: &Spec) -> Value {
    let mut annotations = serde_json::Map::new();
    if let Some(key) = spec.key {
        annotations.insert("aliaslb.io/sharing-key".to_owned(), json!(key));
    }
    if let Some(ip) = spec.request {
        annotations.insert(
            "aliaslb.io/loadBalancerIPs".to_owned(),
            json!(ip.to_string()),
        );
    }
    let mut svc = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": ns, "annotations": annotations },
        "spec": {
            "type": if spec.load_balancer { "LoadBalancer" } else { "ClusterIP" },
            "ports": [{ "name": "http", "port": spec.port, "targetPort": 8080 }],
        },
    });
    if spec.load_balancer {
        svc["spec"]["externalTrafficPolicy"] = json!(if spec.local { "Local" } else { "Cluster" });
    }
    let addresses: Vec<Value> = [1u8, 2]
        .into_iter()
        .map(|n| json!({ "ip": format!("10.244.{n}.10"), "nodeName": node_name(n) }))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [svc, {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": { "name": name, "namespace": ns },
            "subsets": [{ "addresses": addresses, "ports": [{ "name": "http", "port": 8080 }] }],
        }],
    })
}

fn change_patch(change: Change) -> Value {
    let annotation =
        |k: &str, v: Option<String>| json!({ "metadata": { "annotations": { k: v } } });
    match change {
        Change::Port(p) => {
            json!({ "spec": { "ports": [{ "name": "http", "port": p, "targetPort": 8080 }] } })
        }
        Change::Request(ip) => annotation("aliaslb.io/loadBalancerIPs", ip.map(|i| i.to_string())),
        Change::Key(k) => annotation("aliaslb.io/sharing-key", k.map(str::to_owned)),
        Change::Local(true) => json!({ "spec": { "externalTrafficPolicy": "Local" } }),
        // The apiserver allocated a health-check port for Local; Cluster may not keep it.
        Change::Local(false) => json!({ "spec": {
            "externalTrafficPolicy": "Cluster",
            "healthCheckNodePort": null,
        } }),
        // The type-dependent fields go too (the apiserver rejects them on a ClusterIP).
        Change::ToClusterIp => json!({ "spec": {
            "type": "ClusterIP",
            "externalTrafficPolicy": null,
            "healthCheckNodePort": null,
        } }),
        Change::ToLoadBalancer => {
            json!({ "spec": { "type": "LoadBalancer", "externalTrafficPolicy": "Cluster" } })
        }
    }
}

fn pools_configmap(data: &BTreeMap<String, String>) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": "aliaslb-pools", "namespace": SYSTEM_NAMESPACE },
        "data": data,
    })
    .to_string()
}

/// Where `aliaslb` (the CLI) is, as [`Lab`] finds the binaries.
fn cli_path() -> Result<PathBuf, Error> {
    let dir = match std::env::var_os("ALIASLB_E2E_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_exe()
            .ok()
            .and_then(|p| p.parent()?.parent().map(Path::to_path_buf))
            .ok_or_else(|| Error::Environment("no profile directory for aliaslb".to_owned()))?,
    };
    let cli = dir.join("aliaslb");
    if cli.is_file() {
        Ok(cli)
    } else {
        Err(Error::Environment(format!(
            "{} is missing: cargo build --workspace --bins",
            cli.display()
        )))
    }
}

/// Runs the chaos on `lab` (just brought up) for `settings`, then settles and judges.
/// `Err` means the harness itself failed (not a violation).
pub fn run(lab: &Lab, settings: &Settings) -> Result<Report, Error> {
    let t0 = Instant::now();
    let mut chaos = Chaos::prepare(lab, settings, t0)?;
    let checker = Checker::start(Api::from_kubeconfig(lab.admin_kubeconfig())?, t0);
    let watched: Vec<Ipv4Addr> = Pools::initial().0.into_values().flatten().collect();
    let lan = LanSampler::start(watched)?;
    let outcome = chaos.act(settings).and_then(|()| chaos.settle());
    let samples = checker.finish()?;
    let record = lan.finish()?;
    let final_offences = outcome?;
    let mut offences = judge_samples(&samples, &chaos.journal);
    offences.extend(lan_offences(&record, t0, &chaos.mac_names, &chaos.journal));
    offences.extend(final_offences);
    offences.extend(chaos.crashes.iter().cloned());
    for line in chaos.procs.panics() {
        offences.push(Offence {
            invariant: Invariant::Panics,
            at: t0.elapsed(),
            subject: line.clone(),
            detail: line,
        });
    }
    let with_services = samples.iter().filter(|s| s.services.is_some()).count();
    let with_nodes = samples.iter().filter(|s| s.nodes.is_some()).count();
    let max_gap = samples
        .windows(2)
        .map(|w| w[1].at - w[0].at)
        .max()
        .unwrap_or_default();
    chaos.notes.push(format!(
        "{} samples ({with_services} with Services, {with_nodes} with aliases), longest gap {} ms",
        samples.len(),
        max_gap.as_millis()
    ));
    chaos.notes.push(coverage(&samples));
    let alias_double_samples = samples
        .iter()
        .filter(|s| {
            s.nodes
                .as_ref()
                .is_some_and(|n| !alias_doubles(n).is_empty())
        })
        .count();
    let lan_double_rounds = record
        .samples
        .iter()
        .filter(|s| s.answers.values().any(|m| m.len() > 1))
        .count();
    chaos.notes.push(format!(
        "LAN: {} rounds over {} IPs, longest gap {} ms, {lan_double_rounds} rounds with two MACs for an IP (excused or not), {} gratuitous ARPs seen; aliases listed on two nodes in {alias_double_samples} checker samples (not judged)",
        record.samples.len(),
        record.samples.first().map_or(0, |s| s.answers.len()),
        record.max_gap().as_millis(),
        record.announcements.len()
    ));
    let strict = samples
        .iter()
        .filter(|s| {
            !chaos
                .journal
                .gaps
                .iter()
                .any(|(start, end)| *start <= s.at && s.at < *end + REACTION_GRACE)
        })
        .count();
    chaos.notes.push(format!(
        "{strict} of {} samples outside every controller takeover window (+{} s grace)",
        samples.len(),
        REACTION_GRACE.as_secs()
    ));
    Ok(Report {
        seed: settings.seed,
        duration: settings.duration,
        actions: chaos.actions,
        failed_actions: chaos.failed,
        samples: (with_services, with_nodes),
        offences,
        notes: chaos.notes,
    })
}

/// The acting side of a run.
#[derive(Debug)]
struct Chaos<'a> {
    lab: &'a Lab,
    t0: Instant,
    planner: ActionPlanner,
    journal: Journal,
    procs: Processes,
    cli: PathBuf,
    actions: u64,
    failed: u64,
    crashes: Vec<Offence>,
    notes: Vec<String>,
    /// Names of the MACs on the LAN (nodes, client, the foreign host while there).
    mac_names: BTreeMap<Mac, String>,
    /// When each cut controller replica's partition started.
    controller_cuts: BTreeMap<u8, Duration>,
    /// Nodes whose API path is cut now.
    api_cut: BTreeSet<u8>,
}

impl<'a> Chaos<'a> {
    /// Namespaces, the initial pools, the second controller replica.
    fn prepare(lab: &'a Lab, settings: &Settings, t0: Instant) -> Result<Chaos<'a>, Error> {
        let log = lab.lab(&["logs", "controller-1"])?;
        let state = Path::new(log.trim())
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .ok_or_else(|| Error::Output {
                cmd: "scripts/lab logs controller-1".to_owned(),
                why: format!("no state directory above {log:?}"),
            })?;
        let namespaces: String = NAMESPACES
            .iter()
            .map(|ns| crate::fixtures::namespace(ns))
            .collect::<Vec<_>>()
            .join("---\n");
        lab.apply(&namespaces)?;
        let mut planner = ActionPlanner::new(settings.seed);
        let initial = Pools::initial();
        let data = planner.render(&initial);
        let mut chaos = Chaos {
            lab,
            t0,
            planner,
            journal: Journal::default(),
            procs: Processes {
                state,
                up: ["agent-1", "agent-2", "agent-3", "controller-1"]
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
            },
            cli: cli_path()?,
            actions: 0,
            failed: 0,
            crashes: Vec::new(),
            notes: Vec::new(),
            mac_names: lab.mac_names()?,
            controller_cuts: BTreeMap::new(),
            api_cut: BTreeSet::new(),
        };
        chaos.perform(&Action::Pools(data, Some(initial)))?;
        chaos.perform(&Action::StartController(2))?;
        Ok(chaos)
    }

    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    /// The chaos proper, for `settings.duration`.
    fn act(&mut self, settings: &Settings) -> Result<(), Error> {
        let start = self.now();
        let end = start + settings.duration;
        let mut apiserver_restarted = false;
        let mut apiserver_paused = false;
        let mut pause = Rng::new(settings.seed ^ 0x5EED);
        while self.now() < end {
            self.check_crashes()?;
            let action = if !apiserver_restarted && self.now() >= start + settings.duration * 2 / 5
            {
                apiserver_restarted = true;
                Action::RestartApiserver
            } else if !apiserver_paused && self.now() >= start + settings.duration * 7 / 10 {
                apiserver_paused = true;
                Action::PauseApiserver(API_PAUSE)
            } else {
                let kills = self.now() + NO_CONTROLLER_KILLS_BEFORE_END < end;
                self.planner.next(kills)
            };
            println!(
                "[chaos] {:7.1}s #{:<4} {action}",
                self.now().as_secs_f64(),
                self.actions + 1
            );
            if let Err(e) = self.perform(&action) {
                self.failed += 1;
                self.notes.push(format!("action `{action}` failed: {e:?}"));
                println!("[chaos]          failed: {e:?}");
            }
            self.actions += 1;
            std::thread::sleep(Duration::from_millis(100 + pause.below(400)));
        }
        Ok(())
    }

    /// A process expected up that is gone crashed: count it, show its log, restart it.
    fn check_crashes(&mut self) -> Result<(), Error> {
        for name in self.procs.dead() {
            let tail = self.lab.log_tail(&name, 20);
            println!("[chaos] {name} died on its own; its log ends:\n{tail}");
            self.crashes.push(Offence {
                invariant: Invariant::Panics,
                at: self.now(),
                subject: format!("{name} exited at {:.1}s", self.now().as_secs_f64()),
                detail: format!("{name} exited without the chaos killing it; log tail:\n{tail}"),
            });
            if let Some(n) = name.strip_prefix("agent-").and_then(|n| n.parse().ok()) {
                self.lab.start_agent(n)?;
            } else {
                self.lab.start_controller(&name)?;
            }
        }
        Ok(())
    }

    fn kubectl(&self, args: &[&str]) -> Result<(), Error> {
        retry(|| self.lab.kubectl(args).map(drop))
    }

    fn perform(&mut self, action: &Action) -> Result<(), Error> {
        let started = self.now();
        match action {
            Action::Create(ns, name, spec) => {
                let json = service_json(ns, name, spec).to_string();
                let result = retry(|| self.lab.apply(&json));
                self.edited(ns, name, started);
                result
            }
            Action::Change(ns, name, change) => {
                let patch = change_patch(*change).to_string();
                let result = self.kubectl(&[
                    "patch", "service", "-n", ns, name, "--type", "merge", "-p", &patch,
                ]);
                self.edited(ns, name, started);
                result
            }
            Action::Delete(ns, name) => {
                let result = self.kubectl(&["delete", "service", "-n", ns, name, "--wait=false"]);
                self.edited(ns, name, started);
                result
            }
            Action::Pools(data, valid) => {
                let text = pools_configmap(data);
                let verdict =
                    run_with_status(Command::new(&self.cli).args(["validate", "-"]), &text)?;
                if verdict != valid.is_some() {
                    return Err(Error::Output {
                        cmd: "aliaslb validate -".to_owned(),
                        why: format!(
                            "the chaos meant this pool edit to be {} but the validator disagrees: {text}",
                            if valid.is_some() { "valid" } else { "invalid" }
                        ),
                    });
                }
                let result = retry(|| self.lab.apply(&text));
                if let Some(pools) = valid {
                    self.journal
                        .configs
                        .push((started, self.now(), pools.clone()));
                }
                result
            }
            Action::KillController(i) => {
                let name = format!("controller-{i}");
                self.procs.up.remove(&name);
                let result = self.lab.kill(&name);
                self.journal
                    .gaps
                    .push((started, self.now() + CONTROL_TAKEOVER));
                result
            }
            Action::StartController(i) => {
                let name = format!("controller-{i}");
                let result = self.lab.start_controller(&name);
                self.procs.up.insert(name);
                result
            }
            Action::KillAgent(n) => {
                let name = format!("agent-{n}");
                self.procs.up.remove(&name);
                if self.api_cut.contains(n) {
                    self.journal.orphans.push((node_name(*n), started));
                }
                self.lab.kill(&name)
            }
            Action::TermAgent(n) => {
                let name = format!("agent-{n}");
                self.procs.up.remove(&name);
                self.lab.stop(&name)
            }
            Action::StartAgent(n) => {
                let result = self.lab.start_agent(*n);
                self.procs.up.insert(format!("agent-{n}"));
                result
            }
            Action::Cordon(n) => self.kubectl(&["cordon", &node_name(*n)]),
            Action::Uncordon(n) => self.kubectl(&["uncordon", &node_name(*n)]),
            Action::RestartApiserver => {
                // `scripts/lab up` starts whatever of the lab is missing with the same
                // arguments as the first time: here, just the apiserver.
                let result = self
                    .lab
                    .stop("kube-apiserver")
                    .and_then(|()| self.lab.lab(&["up"]).map(drop));
                let back = self.now();
                self.notes.push(format!(
                    "apiserver restart: down at {:.1}s, ready again {:.1} s later",
                    started.as_secs_f64(),
                    (back - started).as_secs_f64()
                ));
                self.journal.gaps.push((started, back + CONTROL_TAKEOVER));
                result
            }
            Action::PauseApiserver(d) => {
                let result = crate::lab::ApiPause::new(self.lab).and_then(|paused| {
                    std::thread::sleep(*d);
                    paused.resume()
                });
                let ready = crate::lab::wait_for(
                    "the apiserver to answer after SIGCONT",
                    Duration::from_secs(60),
                    || {
                        Ok(match self.lab.kubectl(&["get", "--raw", "/readyz"]) {
                            Ok(out) if out.trim() == "ok" => Ok(()),
                            Ok(out) => Err(out),
                            Err(e) => Err(e.to_string()),
                        })
                    },
                );
                let back = self.now();
                self.notes.push(format!(
                    "apiserver pause: stopped at {:.1}s for {} s, answering again {:.1} s after SIGSTOP",
                    started.as_secs_f64(),
                    d.as_secs(),
                    (back - started).as_secs_f64()
                ));
                self.journal.gaps.push((started, back + CONTROL_TAKEOVER));
                result.and(ready)
            }
            Action::PartitionNode(n) => {
                self.api_cut.insert(*n);
                self.lab.partition_api(*n)
            }
            Action::HealNode(n) => {
                self.api_cut.remove(n);
                self.lab.heal_api(*n)
            }
            Action::PartitionController(i) => {
                self.controller_cuts.insert(*i, started);
                // If it leads, nobody acts until its Lease expires and the other takes over.
                self.journal
                    .gaps
                    .push((started, started + CONTROL_TAKEOVER));
                self.lab.partition_controller(&format!("controller-{i}"))
            }
            Action::HealController(i) => {
                let result = self.lab.heal_controller(&format!("controller-{i}"));
                let from = self.controller_cuts.remove(i).unwrap_or(started);
                // Back, it must notice it was deposed; the other may have led meanwhile.
                self.journal
                    .gaps
                    .push((from, self.now() + CONTROL_TAKEOVER));
                result
            }
            Action::Rogue(ip) => {
                let mac = self.lab.add_rogue(*ip)?;
                self.mac_names.insert(
                    mac,
                    format!("{} (foreign, holding {ip})", crate::lab::ROGUE_NS),
                );
                self.journal.foreign.insert(mac);
                Ok(())
            }
            Action::RemoveRogue => self.lab.remove_rogue(),
        }
    }

    fn edited(&mut self, ns: &str, name: &str, started: Duration) {
        let done = self.now();
        self.journal
            .edits
            .entry((ns.to_owned(), name.to_owned()))
            .or_default()
            .push((started, done));
    }

    /// Everything back up, a leader renewing, a quiet lease + 2 s; then the end-state
    /// invariants (4 and 5), re-checked for up to [`SETTLE_MAX`] while they converge.
    fn settle(&mut self) -> Result<Vec<Offence>, Error> {
        let quiet_from = self.now();
        for (_, restart) in std::mem::take(&mut self.planner.restarts) {
            self.perform(&restart)?;
        }
        for n in std::mem::take(&mut self.planner.cordoned) {
            self.perform(&Action::Uncordon(n))?;
        }
        self.check_crashes()?;
        self.wait_leading()?;
        std::thread::sleep(LEASE_DURATION + Duration::from_secs(2));
        let pools = self
            .journal
            .final_pools()
            .cloned()
            .ok_or_else(|| Error::Environment("no valid pool config recorded".to_owned()))?;
        let api = Api::from_kubeconfig(self.lab.admin_kubeconfig())?;
        let checked_from = self.now();
        loop {
            let at = self.now();
            let services = api.services()?;
            let nodes = node_aliases()?;
            let mut offences = stray_aliases(&services, &nodes, at);
            offences.extend(silent_pending(&services, &pools, at));
            if offences.is_empty() || at >= checked_from + SETTLE_MAX {
                self.notes.push(format!(
                    "settle: quiet from {:.1}s, end state checked {:.1} s later{}",
                    quiet_from.as_secs_f64(),
                    (at - quiet_from).as_secs_f64(),
                    if offences.is_empty() {
                        " (clean)"
                    } else {
                        " (violations left)"
                    }
                ));
                let lb = services
                    .iter()
                    .filter(|s| s.load_balancer && s.ns.starts_with("chaos-"));
                let (with_ip, total) = lb.fold((0, 0), |(w, t), s| {
                    (w + usize::from(!s.view.ips.is_empty()), t + 1)
                });
                self.notes.push(format!(
                    "end state: {with_ip} of {total} chaos LoadBalancer Services have an IP; aliases {nodes:?}"
                ));
                self.check_crashes()?;
                return Ok(offences);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Waits until a running replica holds the leader Lease and renews it.
    fn wait_leading(&self) -> Result<(), Error> {
        let mut first_renew: Option<String> = None;
        crate::lab::wait_for(
            "a running controller to lead and renew",
            Duration::from_secs(60),
            || {
                let lease =
                    self.lab
                        .get_json(&["lease", "-n", SYSTEM_NAMESPACE, "aliaslb-controller"])?;
                let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default();
                let renew = lease["spec"]["renewTime"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let first = first_renew.get_or_insert_with(|| renew.clone());
                Ok(if self.procs.up.contains(holder) && renew != *first {
                    Ok(())
                } else {
                    Err(format!("holder {holder:?}, renewTime {renew}"))
                })
            },
        )
    }
}

/// Runs `cmd` with `input` on stdin: `true` for exit status 0, `false` for 1, an error
/// otherwise (a usage error of the validator).
fn run_with_status(cmd: &mut Command, input: &str) -> Result<bool, Error> {
    match crate::lab::run_with_input(cmd, Some(input)) {
        Ok(_) => Ok(true),
        Err(Error::Command { status, .. }) if status.code() == Some(1) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    /// An LB Service `ns/name` with `ips`, on `node`, with `key`.
    fn svc(ns: &str, name: &str, ips: &[&str], key: Option<&str>) -> ServiceSeen {
        ServiceSeen {
            ns: ns.to_owned(),
            name: name.to_owned(),
            load_balancer: true,
            sharing_key: key.map(str::to_owned),
            view: ServiceReadback {
                ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
                all_ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
                node: None,
                conditions: BTreeMap::new(),
            },
        }
    }

    fn on(mut s: ServiceSeen, node: u8) -> ServiceSeen {
        s.view.node = Some(node_name(node));
        s
    }

    fn pools(keys: &[(&str, &[u8])]) -> Pools {
        Pools(
            keys.iter()
                .map(|(k, ips)| (k.to_string(), ips.iter().map(|l| lan(*l)).collect()))
                .collect(),
        )
    }

    fn journal_with(configs: Vec<(u64, Pools)>) -> Journal {
        Journal {
            configs: configs
                .into_iter()
                .map(|(t, p)| (secs(t), secs(t), p))
                .collect(),
            ..Journal::default()
        }
    }

    #[test]
    fn the_same_seed_plans_the_same_actions() {
        let plan = |seed| {
            let mut p = ActionPlanner::new(seed);
            (0..300).map(|_| p.next(true)).collect::<Vec<_>>()
        };
        assert_eq!(plan(42), plan(42));
        assert_ne!(plan(42), plan(43));
    }

    #[test]
    fn plans_cover_every_kind_of_action_and_restart_what_they_stop() {
        let mut p = ActionPlanner::new(7);
        let actions: Vec<Action> = (0..2000).map(|_| p.next(true)).collect();
        let has = |f: &dyn Fn(&Action) -> bool| actions.iter().any(f);
        assert!(has(&|a| matches!(a, Action::Create(..))));
        assert!(has(&|a| matches!(a, Action::Delete(..))));
        assert!(has(&|a| matches!(
            a,
            Action::Change(_, _, Change::ToClusterIp)
        )));
        assert!(has(&|a| matches!(
            a,
            Action::Change(_, _, Change::Key(Some(_)))
        )));
        assert!(has(&|a| matches!(a, Action::Pools(_, None))));
        assert!(has(&|a| matches!(a, Action::Pools(_, Some(_)))));
        assert!(has(&|a| matches!(a, Action::KillController(_))));
        assert!(has(&|a| matches!(a, Action::TermAgent(_))));
        assert!(has(&|a| matches!(a, Action::Cordon(_))));
        assert!(has(&|a| matches!(a, Action::PartitionNode(_))));
        assert!(has(&|a| matches!(a, Action::PartitionController(_))));
        assert!(has(&|a| matches!(a, Action::Rogue(_))));
        let count = |f: &dyn Fn(&Action) -> bool| actions.iter().filter(|a| f(a)).count();
        // Every fault is undone a few actions later (the last one maybe in the settle).
        let cuts = count(&|a| matches!(a, Action::PartitionNode(_)));
        let heals = count(&|a| matches!(a, Action::HealNode(_)));
        assert!(cuts - heals <= 1, "{cuts} node partitions, {heals} heals");
        let rogues = count(&|a| matches!(a, Action::Rogue(_)));
        let gone = count(&|a| matches!(a, Action::RemoveRogue));
        assert!(
            rogues - gone <= 1,
            "{rogues} foreign hosts, {gone} removals"
        );
        let ccuts = count(&|a| matches!(a, Action::PartitionController(_)));
        let cheals = count(&|a| matches!(a, Action::HealController(_)));
        assert!(
            ccuts - cheals <= 1,
            "{ccuts} controller cuts, {cheals} heals"
        );
        let kills = actions
            .iter()
            .filter(|a| matches!(a, Action::KillAgent(_) | Action::TermAgent(_)))
            .count();
        let starts = actions
            .iter()
            .filter(|a| matches!(a, Action::StartAgent(_)))
            .count();
        assert!(
            kills - starts <= 2,
            "{kills} agent stops, {starts} restarts"
        );
        let controller_kills: Vec<usize> = actions
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Action::KillController(_)))
            .map(|(i, _)| i)
            .collect();
        assert!(
            controller_kills
                .windows(2)
                .all(|w| w[1] - w[0] >= CONTROLLER_KILL_SPACING as usize),
            "controller kills too close: {controller_kills:?}"
        );
    }

    #[test]
    fn no_controller_kills_when_not_allowed() {
        let mut p = ActionPlanner::new(7);
        assert!(
            (0..2000)
                .map(|_| p.next(false))
                .all(|a| !matches!(a, Action::KillController(_)))
        );
    }

    #[test]
    fn pool_of_falls_back_only_without_an_own_key() {
        let p = pools(&[("chaos-a", &[20]), (FALLBACK, &[50])]);
        assert_eq!(p.pool_of("chaos-a"), Some(&[lan(20)].into()));
        assert_eq!(p.pool_of("chaos-d"), Some(&[lan(50)].into()));
        assert_eq!(pools(&[("chaos-a", &[20])]).pool_of("chaos-d"), None);
    }

    #[test]
    fn a_share_under_one_key_in_one_namespace_is_no_double_assignment() {
        let j = Journal::default();
        let shared = [
            svc("chaos-a", "s1", &["192.168.55.20"], Some("k1")),
            svc("chaos-a", "s2", &["192.168.55.20"], Some("k1")),
        ];
        assert!(double_assignments(&shared, secs(30), &j).is_empty());
        let keyless = [
            svc("chaos-a", "s1", &["192.168.55.20"], None),
            svc("chaos-a", "s2", &["192.168.55.20"], None),
        ];
        assert_eq!(double_assignments(&keyless, secs(30), &j).len(), 1);
        let across = [
            svc("chaos-a", "s1", &["192.168.55.20"], Some("k1")),
            svc("chaos-b", "s1", &["192.168.55.20"], Some("k1")),
        ];
        assert_eq!(double_assignments(&across, secs(30), &j).len(), 1);
    }

    #[test]
    fn a_key_change_excuses_a_double_only_until_the_controller_could_react() {
        let mut j = Journal::default();
        j.edits
            .insert(("chaos-a".into(), "s2".into()), vec![(secs(10), secs(10))]);
        let pair = [
            svc("chaos-a", "s1", &["192.168.55.20"], Some("k1")),
            svc("chaos-a", "s2", &["192.168.55.20"], Some("k2")),
        ];
        assert!(double_assignments(&pair, secs(12), &j).is_empty());
        assert_eq!(
            double_assignments(&pair, secs(10) + REACTION_GRACE, &j).len(),
            1
        );
        // A controller gap stretches the grace.
        j.gaps.push((secs(11), secs(30)));
        assert!(double_assignments(&pair, secs(35), &j).is_empty());
        assert_eq!(
            double_assignments(&pair, secs(30) + REACTION_GRACE, &j).len(),
            1
        );
    }

    #[test]
    fn outside_pool_is_judged_against_the_configs_possibly_in_force() {
        let j = journal_with(vec![
            (0, pools(&[("chaos-a", &[20, 21])])),
            (20, pools(&[("chaos-a", &[22])])),
        ]);
        let s = [svc("chaos-a", "s1", &["192.168.55.20"], None)];
        assert!(outside_pool(&s, secs(5), &j).is_empty());
        // The shrink is unreacted for a while, then the old address is a violation.
        assert!(outside_pool(&s, secs(25), &j).is_empty());
        assert_eq!(outside_pool(&s, secs(20) + REACTION_GRACE, &j).len(), 1);
        // The new address is fine from the start of the edit, not before.
        let new = [svc("chaos-a", "s1", &["192.168.55.22"], None)];
        assert!(outside_pool(&new, secs(20), &j).is_empty());
        assert_eq!(outside_pool(&new, secs(19), &j).len(), 1);
        // ClusterIP Services are not judged.
        let mut cluster_ip = svc("chaos-a", "s1", &["192.168.55.99"], None);
        cluster_ip.load_balancer = false;
        assert!(outside_pool(&[cluster_ip], secs(5), &j).is_empty());
    }

    #[test]
    fn aliases_on_two_nodes_are_listed_for_the_note() {
        let nodes: BTreeMap<u8, BTreeSet<Ipv4Addr>> =
            [(1, [lan(20)].into()), (2, [lan(20), lan(21)].into())].into();
        assert_eq!(alias_doubles(&nodes), [lan(20)].into());
    }

    #[test]
    fn only_a_cut_off_agents_sigkill_excuses_its_nodes_answers_for_the_alias_lifetime() {
        use crate::lan::LanSample;
        let t0 = Instant::now();
        let (a, b) = (Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]));
        let names: BTreeMap<Mac, String> =
            [(a, "alb-node-1".to_owned()), (b, "alb-node-2".to_owned())].into();
        // Both answering for the 500 ms up to `t` (beyond the yield bound after both
        // first showed).
        let double_at = |t: Duration| LanRecord {
            samples: (0..=25)
                .map(|i| LanSample {
                    at: t0 + t - Duration::from_millis(500) + Duration::from_millis(20 * i),
                    answers: [(lan(20), [a, b].into())].into(),
                })
                .collect(),
            announcements: Vec::new(),
            requests: Vec::new(),
        };
        let journal = Journal {
            orphans: vec![("alb-node-2".to_owned(), secs(10))],
            ..Journal::default()
        };
        let count = |r: &LanRecord, j: &Journal| lan_offences(r, t0, &names, j).len();
        assert_eq!(
            count(&double_at(secs(11)), &journal),
            0,
            "within the lifetime"
        );
        assert!(count(&double_at(secs(15)), &journal) > 0, "past it");
        assert!(count(&double_at(secs(10)), &journal) > 0, "before the kill");
        assert!(
            count(&double_at(secs(11)), &Journal::default()) > 0,
            "no orphan"
        );
        let other = Journal {
            orphans: vec![("alb-node-3".to_owned(), secs(10))],
            ..Journal::default()
        };
        assert!(count(&double_at(secs(11)), &other) > 0, "another node's");
    }

    #[test]
    fn a_foreign_host_answering_beside_one_holder_is_no_double_but_two_nodes_are() {
        use crate::lan::LanSample;
        let t0 = Instant::now();
        let (a, b, rogue) = (
            Mac([2, 0, 0, 0, 0, 1]),
            Mac([2, 0, 0, 0, 0, 2]),
            Mac([2, 0xaa, 0, 0, 0, 9]),
        );
        let names: BTreeMap<Mac, String> =
            [(a, "alb-node-1".to_owned()), (b, "alb-node-2".to_owned())].into();
        let record = |macs: BTreeSet<Mac>| LanRecord {
            samples: (0..=25)
                .map(|i| LanSample {
                    at: t0 + secs(10) + Duration::from_millis(20 * i),
                    answers: [(lan(20), macs.clone())].into(),
                })
                .collect(),
            announcements: Vec::new(),
            requests: Vec::new(),
        };
        let journal = Journal {
            foreign: [rogue].into(),
            ..Journal::default()
        };
        let count = |r: &LanRecord, j: &Journal| lan_offences(r, t0, &names, j).len();
        // The holder defends its IP and keeps it while the rogue answers too: by design.
        assert_eq!(count(&record([a, rogue].into()), &journal), 0);
        assert!(count(&record([a, b].into()), &journal) > 0, "two nodes");
        assert!(
            count(&record([a, b, rogue].into()), &journal) > 0,
            "two nodes and it"
        );
        assert!(
            count(&record([a, rogue].into()), &Journal::default()) > 0,
            "a MAC the chaos did not put there is judged"
        );
    }

    #[test]
    fn lan_doubles_count_per_ip_and_every_stall_counts() {
        use crate::lan::{LanSample, YIELD_BOUND};
        let t0 = Instant::now();
        let (a, b) = (Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]));
        let ms = Duration::from_millis;
        // Two MACs for .20 from the start for 300 ms (no announcement), then a stall.
        let mut samples: Vec<LanSample> = (0..16)
            .map(|i| LanSample {
                at: t0 + ms(20 * i),
                answers: [(lan(20), [a, b].into()), (lan(21), [a].into())].into(),
            })
            .collect();
        samples.push(LanSample {
            at: t0 + ms(300) + YIELD_BOUND + ms(50),
            answers: [(lan(20), [a].into()), (lan(21), [a].into())].into(),
        });
        let record = LanRecord {
            samples,
            announcements: Vec::new(),
            requests: Vec::new(),
        };
        let offences = lan_offences(&record, t0, &BTreeMap::new(), &Journal::default());
        let report = Report {
            seed: 1,
            duration: secs(1),
            actions: 0,
            failed_actions: 0,
            samples: (1, 1),
            offences,
            notes: Vec::new(),
        };
        assert_eq!(
            report.count(Invariant::LanDouble),
            1,
            "{}",
            report.details()
        );
        assert_eq!(report.count(Invariant::LanStall), 1, "{}", report.details());
        assert!(report.details().contains("192.168.55.20 answered by"));
    }

    #[test]
    fn an_alias_is_stray_unless_its_service_assigns_it_to_that_node() {
        let services = [on(svc("chaos-a", "s1", &["192.168.55.20"], None), 1)];
        let nodes: BTreeMap<u8, BTreeSet<Ipv4Addr>> = [
            (1, [lan(20)].into()),
            (2, [lan(20), lan(21)].into()),
            (3, BTreeSet::new()),
        ]
        .into();
        let stray: Vec<String> = stray_aliases(&services, &nodes, secs(1))
            .into_iter()
            .map(|o| o.subject)
            .collect();
        assert_eq!(
            stray,
            ["192.168.55.20 on alb-node-2", "192.168.55.21 on alb-node-2"]
        );
    }

    #[test]
    fn pending_needs_a_reason_while_the_pool_has_room() {
        let p = pools(&[("chaos-a", &[20, 21]), ("chaos-b", &[30])]);
        let mut with_reason = svc("chaos-a", "s2", &[], None);
        with_reason.view.conditions.insert(
            "aliaslb.io/IPAllocated".into(),
            crate::lab::ServiceCondition {
                status: "False".into(),
                reason: "RequestedIPInUse".into(),
                message: "m".into(),
            },
        );
        let services = [
            svc("chaos-a", "s1", &["192.168.55.20"], None),
            with_reason,
            svc("chaos-a", "s3", &[], None),
            svc("chaos-b", "s1", &["192.168.55.30"], None),
            svc("chaos-b", "s2", &[], None),
        ];
        let silent: Vec<String> = silent_pending(&services, &p, secs(1))
            .into_iter()
            .map(|o| o.subject)
            .collect();
        // chaos-b's pool is full: its pending Service is not counted here.
        assert_eq!(silent, ["chaos-a/s3"]);
    }

    #[test]
    fn summary_counts_each_subject_once() {
        let offence = |subject: &str, at| Offence {
            invariant: Invariant::LanDouble,
            at: secs(at),
            subject: subject.to_owned(),
            detail: String::new(),
        };
        let report = Report {
            seed: 9,
            duration: secs(60),
            actions: 5,
            failed_actions: 0,
            samples: (1, 1),
            offences: vec![offence("a", 1), offence("a", 2), offence("b", 3)],
            notes: Vec::new(),
        };
        assert_eq!(
            report.summary(),
            "chaos: seed=9 duration=60s actions=5 violations: double-assign=0 outside-pool=0 \
             lan-double=2 lan-stall=0 stray-alias=0 silent-pending=0 panics=0"
        );
        assert!(!report.is_clean());
    }
}
