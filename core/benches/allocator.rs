//! Allocator throughput on big, busy pools: `cargo bench -p aliaslb-core --bench allocator`.
//!
//! Every busy ledger has 100,000 addresses in use, one in every seven, so its free map holds
//! about 100,000 intervals: the worst shape for a lowest-first allocator, as after months of
//! scattered requests and releases. Figures are recorded in `BENCHMARKS.md`.

use std::hint::black_box;
use std::net::IpAddr;
use std::time::Duration;

use aliaslb_core::ledger::Ledger;
use aliaslb_core::range::{IpRange, from_u128, to_u128};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

/// Addresses in use in the busy ledgers.
const IN_USE: u128 = 100_000;
/// Distance between two used addresses.
const STRIDE: u128 = 7;
/// Assignments imported into an empty ledger.
const IMPORTED: u128 = 10_000;

fn net(cidr: &str) -> IpRange {
    let net: ipnet::IpNet = cidr.parse().unwrap();
    IpRange::new(net.network(), net.broadcast()).unwrap()
}

/// `count` addresses of `range`, one every `STRIDE`, from its first address.
fn scattered(range: IpRange, count: u128) -> Vec<IpAddr> {
    let first = to_u128(range.first());
    (0..count)
        .map(|i| from_u128(range.family(), first + i * STRIDE))
        .collect()
}

/// A ledger over `range` with `IN_USE` scattered addresses taken.
fn busy(range: IpRange) -> Ledger {
    let mut ledger = Ledger::new(&[range]);
    for ip in scattered(range, IN_USE) {
        ledger.import(ip).unwrap();
    }
    ledger
}

/// A small deterministic generator (xorshift64) of request addresses inside `range`.
fn requests(range: IpRange) -> impl FnMut() -> IpAddr {
    let first = to_u128(range.first());
    let len = range.len();
    let family = range.family();
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        from_u128(family, first + u128::from(state) % len)
    }
}

fn busy_pools(c: &mut Criterion) {
    for (name, range) in [
        ("ipv4_slash8", net("10.0.0.0/8")),
        ("ipv6_slash64", net("2001:db8::/64")),
    ] {
        let family = range.family();
        let mut ledger = busy(range);
        assert_eq!(ledger.usage(family).in_use, IN_USE);

        let mut group = c.benchmark_group(format!("{name}_{IN_USE}_in_use"));
        group.throughput(Throughput::Elements(1));
        group.bench_function("allocate_lowest+release", |b| {
            b.iter(|| {
                let ip = ledger.allocate(black_box(family)).unwrap();
                assert!(ledger.release(black_box(ip)));
            })
        });
        let mut next = requests(range);
        group.bench_function("allocate_specific+release", |b| {
            b.iter(|| {
                let ip = next();
                if ledger.allocate_specific(black_box(ip)).is_ok() {
                    assert!(ledger.release(ip));
                }
            })
        });
        group.finish();
        assert_eq!(
            ledger.usage(family).in_use,
            IN_USE,
            "benchmarks leak nothing"
        );
    }
}

fn import(c: &mut Criterion) {
    let range = net("10.0.0.0/8");
    let assignments = scattered(range, IMPORTED);
    let mut group = c.benchmark_group("import");
    // One sample imports 10,000 addresses: fewer samples keep the run near 3 s.
    group.sample_size(30);
    group.throughput(Throughput::Elements(IMPORTED as u64));
    group.bench_function("10000_into_empty_ipv4_slash8", |b| {
        b.iter_batched(
            || Ledger::new(&[range]),
            |mut ledger| {
                for ip in &assignments {
                    ledger.import(black_box(*ip)).unwrap();
                }
                ledger
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn config() -> Criterion {
    // Short runs: the machine has two cores shared with other builds.
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = busy_pools, import
}
criterion_main!(benches);
