//! The chaos run with invariants over the lab, with the real binaries (2 controller replicas,
//! 3 agents): seeded random Service, pool, process and node actions (API-only partitions
//! of a node or a controller, a foreign host taking a pool address, an apiserver restart
//! and pause among them) for a bounded time, a checker sampling the cluster every 200 ms
//! and the LAN sampler asking who answers ARP for every pool address every 20 ms (one MAC
//! per IP, except within the 100 ms yield bound), then one summary line; every count must
//! be 0.
//!
//! The short form (60 s of chaos, under 3 minutes with the lab) runs in `cargo test`;
//! replay a seed or run long by hand (needs root):
//!
//! ```sh
//! cargo build --workspace --bins
//! ALIASLB_CHAOS_SEED=1234 ALIASLB_CHAOS_SECONDS=600 \
//!     cargo test -p aliaslb-e2e --test chaos -- --nocapture
//! ```

use aliaslb_e2e::Error;
use aliaslb_e2e::chaos::{self, Settings};
use aliaslb_e2e::lab::Lab;

#[test]
fn chaos_keeps_every_invariant() -> Result<(), Error> {
    let settings = Settings::from_env()?;
    // Printed before anything can fail, so a failing run can be replayed.
    println!(
        "[chaos] seed={} duration={}s (replay: {}={} {}={})",
        settings.seed,
        settings.duration.as_secs(),
        chaos::SEED_ENV,
        settings.seed,
        chaos::SECONDS_ENV,
        settings.duration.as_secs()
    );
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    let report = chaos::run(&lab, &settings)?;
    println!("{}", report.details());
    println!("{}", report.summary());
    assert!(
        report.samples.0 > 0 && report.samples.1 > 0,
        "the checker took no samples: {}",
        report.details()
    );
    assert!(
        report.is_clean(),
        "{}\n{}",
        report.summary(),
        report.details()
    );
    Ok(())
}
