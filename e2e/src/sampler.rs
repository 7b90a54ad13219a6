//! The address sampler: lists the /32 aliases on `eth0` of every node namespace every 50 ms
//! on a background thread, to prove an IP is never configured on two nodes (or for how
//! long it was). Does I/O (`ip -j addr`).
//!
//! One sample reads the nodes in the order 1, 2, 3, 3, 2, 1 and counts an IP as held by a
//! node only if both of that node's reads show it. The reads are not atomic, but the
//! windows nest (node 1's spans node 2's spans node 3's), and an alias that is present at
//! both ends of a window was present during all of it (it is added and removed once per
//! move): two nodes counted as holding the same IP really held it at the same instant.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Error;
use crate::lab::{NODES, node_name, run};

/// How often the sampler looks.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(50);

/// The /32 addresses on `eth0` of node `n` (the load-balancer aliases: the node's own
/// address is a /24).
pub fn aliases(n: u8) -> Result<BTreeSet<Ipv4Addr>, Error> {
    eth0_addresses(n, "-4", 32)
}

/// The /128 addresses on `eth0` of node `n` (its IPv6 load-balancer aliases: the node's own
/// address is a /64).
pub fn aliases6(n: u8) -> Result<BTreeSet<std::net::Ipv6Addr>, Error> {
    eth0_addresses(n, "-6", 128)
}

/// The addresses of `family` (`-4`, `-6`) with prefix length `prefix_len` on `eth0` of node `n`.
fn eth0_addresses<T: std::str::FromStr + Ord>(
    n: u8,
    family: &str,
    prefix_len: u64,
) -> Result<BTreeSet<T>, Error> {
    let ns = node_name(n);
    let out =
        run(Command::new("ip").args(["-n", &ns, "-j", family, "addr", "show", "dev", "eth0"]))?;
    let v: Value = serde_json::from_str(&out).map_err(|e| Error::Output {
        cmd: format!("ip -n {ns} -j {family} addr show dev eth0"),
        why: format!("not JSON: {e}"),
    })?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().into_iter().flatten())
        .filter(|a| a["prefixlen"].as_u64() == Some(prefix_len))
        .filter_map(|a| a["local"].as_str()?.parse().ok())
        .collect())
}

/// One look at every node.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When (between the two passes).
    pub at: Instant,
    /// The aliases each node held throughout the sample.
    pub held: BTreeMap<u8, BTreeSet<Ipv4Addr>>,
}

impl Sample {
    /// The nodes holding `ip`.
    pub fn holders(&self, ip: Ipv4Addr) -> BTreeSet<u8> {
        self.held
            .iter()
            .filter(|(_, ips)| ips.contains(&ip))
            .map(|(n, _)| *n)
            .collect()
    }
}

/// An IP seen on more than one node in one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Double {
    /// When.
    pub at: Instant,
    /// The IP.
    pub ip: Ipv4Addr,
    /// The nodes holding it.
    pub nodes: BTreeSet<u8>,
}

/// The samples of one run.
#[derive(Debug, Clone)]
pub struct Samples(pub Vec<Sample>);

impl Samples {
    /// Every (sample, IP) where the IP was on two or more nodes.
    pub fn doubles(&self) -> Vec<Double> {
        self.0
            .iter()
            .flat_map(|s| {
                let ips: BTreeSet<Ipv4Addr> = s.held.values().flatten().copied().collect();
                ips.into_iter().filter_map(move |ip| {
                    let nodes = s.holders(ip);
                    (nodes.len() > 1).then_some(Double {
                        at: s.at,
                        ip,
                        nodes,
                    })
                })
            })
            .collect()
    }

    /// The samples taken at or after `t`.
    pub fn since(&self, t: Instant) -> Samples {
        Samples(self.0.iter().filter(|s| s.at >= t).cloned().collect())
    }

    /// The samples taken before `t`.
    pub fn before(&self, t: Instant) -> Samples {
        Samples(self.0.iter().filter(|s| s.at < t).cloned().collect())
    }

    /// The last sample at which node `n` held `ip`.
    pub fn last_on(&self, ip: Ipv4Addr, n: u8) -> Option<Instant> {
        self.0
            .iter()
            .rev()
            .find(|s| s.held.get(&n).is_some_and(|ips| ips.contains(&ip)))
            .map(|s| s.at)
    }

    /// The longest time between two consecutive samples (the sampler's real resolution).
    pub fn max_gap(&self) -> Duration {
        self.0
            .windows(2)
            .map(|w| w[1].at - w[0].at)
            .max()
            .unwrap_or_default()
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A running sampler; [`Sampler::finish`] stops it and returns what it saw.
#[derive(Debug)]
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Vec<Sample>, Error>>,
}

impl Sampler {
    /// Starts sampling every [`SAMPLE_PERIOD`].
    pub fn start() -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut next = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                samples.push(sample()?);
                next += SAMPLE_PERIOD;
                match next.checked_duration_since(Instant::now()) {
                    Some(wait) => std::thread::sleep(wait),
                    // Slower than the period (a loaded machine): go on at once.
                    None => next = Instant::now(),
                }
            }
            Ok(samples)
        });
        Sampler { stop, thread }
    }

    /// Stops the sampler and returns its samples.
    pub fn finish(self) -> Result<Samples, Error> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| Error::Environment("the sampler thread panicked".to_owned()))?
            .map(Samples)
    }
}

fn sample() -> Result<Sample, Error> {
    let mut first = BTreeMap::new();
    for n in NODES {
        first.insert(n, aliases(n)?);
    }
    let at = Instant::now();
    let mut held = BTreeMap::new();
    for n in NODES.into_iter().rev() {
        let again = aliases(n)?;
        let both = first[&n].intersection(&again).copied().collect();
        held.insert(n, both);
    }
    Ok(Sample { at, held })
}
