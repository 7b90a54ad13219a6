//! What signing costs fast failover: `cargo bench -p aliaslb-core --bench advert`.
//!
//! One advert of a full round's piece (64 IPv6 addresses, the largest an advert carries),
//! encoded and signed by its holder, then verified and read by its standby: with each
//! node's own Ed25519 key (version 2, today's protocol) beside the floor of the shared
//! HMAC-SHA256 key of version 1 over the same bytes (what the agent of before did). Per
//! 1,000 IPs a holder sends 16 such adverts a round (10 rounds a second at the default
//! interval): the cost per second is 160 times a figure below, on each side (and once more
//! on a relay, which verifies what it forwards). Figures are recorded in `BENCHMARKS.md`.

use std::hint::black_box;
use std::net::{IpAddr, Ipv6Addr};

use aliaslb_core::advert::{Advert, Message, SigningKey};
use criterion::{Criterion, criterion_group, criterion_main};
use ring::hmac;

fn advert() -> Advert {
    Advert {
        from: "worker-node-017.example.internal".into(),
        to: "worker-node-042.example.internal".into(),
        counter: 1_234_567,
        ips: (0..64u16)
            .map(|i| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, i)))
            .collect(),
    }
}

fn bench(c: &mut Criterion) {
    let key = SigningKey::generate().unwrap();
    let public = key.public_key();
    let a = advert();
    let signed = a.encode(&key);
    // The floor: version 1's HMAC over the same body (the signature's 64 bytes stand in
    // for the body's length difference: the tag is computed over everything before it).
    let shared = hmac::Key::new(hmac::HMAC_SHA256, &[7; 32]);
    let body = &signed[..signed.len() - 64];
    let tag = hmac::sign(&shared, body);
    let mut g = c.benchmark_group("advert of 64 IPv6 addresses");
    g.bench_function("sign: Ed25519, the node's own key", |b| {
        b.iter(|| black_box(&a).encode(&key))
    });
    g.bench_function("sign: HMAC-SHA256, the shared key (floor)", |b| {
        b.iter(|| {
            let mut out = black_box(body).to_vec();
            out.extend_from_slice(hmac::sign(&shared, &out).as_ref());
            out
        })
    });
    g.bench_function("verify and read: Ed25519", |b| {
        b.iter(|| Message::verify(black_box(&signed), &public).unwrap())
    });
    g.bench_function("verify: HMAC-SHA256 (floor)", |b| {
        b.iter(|| hmac::verify(&shared, black_box(body), tag.as_ref()).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
