//! Which pool configuration is in force, given what the ConfigMap cache shows and what was
//! handled before. Pure: the reconcile loop feeds it each pass's observation and publishes
//! the [`ConfigNotice`]s it returns (log, Event, metrics).
//!
//! The rules:
//! - A valid ConfigMap is in force as written. An edit that removes a key is an instruction
//!   like any other: that namespace's Services lose their IPs.
//! - An invalid ConfigMap changes nothing: the last valid config stays in force (none
//!   before the first valid one: the loop then plans nothing).
//! - **A deleted ConfigMap is not an instruction**: `kubectl delete -k` or a GitOps prune
//!   removes the whole object, and applying "no pools" would release every IP at once. The
//!   config in force before the deletion stays in force (none, if none was), reported as
//!   stale, until the ConfigMap exists again.
//! - A controller that starts without a ConfigMap cannot tell a deletion (followed by a
//!   restart or a failover) from an install that has none yet. It looks at whether
//!   anything is assigned already (our node assignments, or our IPs on Services): if so,
//!   the ConfigMap was deleted and nothing is planned (nothing released; not valid, with
//!   a Warning) until it exists again; if not, it is a new install and runs on no pools
//!   (every Service `NoPool`).

use std::collections::BTreeMap;

use aliaslb_core::pool::{PoolConfig, PoolConfigError};

/// The ConfigMap's `data` (an object without `data` counts as empty); `None`: no object.
pub type ConfigData<'a> = Option<&'a BTreeMap<String, String>>;

/// What the handling of an observation calls for, published by the caller: one per
/// change of what the cache shows, none while it shows the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigNotice {
    /// No ConfigMap at the first look and nothing assigned: no pools are in force. Logged;
    /// no Event (there is nothing to report it on but the controller, and every Service
    /// says `NoPool`).
    MissingAtStart,
    /// No ConfigMap at the first look while IPs are assigned: it was deleted before this
    /// controller started; nothing is planned until it exists again. Logged; a Warning
    /// Event.
    MissingWithAssignments,
    /// The ConfigMap was deleted: what was in force stays, `pools` pools (`None`: no valid
    /// config had been seen, nothing is planned). Logged; a Warning Event.
    Deleted {
        /// Pools of the config kept in force.
        pools: Option<usize>,
    },
    /// A valid config is now in force.
    Loaded {
        /// Its number of pools.
        pools: usize,
        /// Whether to announce it with an Event: not at the first look (nothing was
        /// reported before), nor for content equal to what is in force unless it resolves
        /// a Warning (invalid content, deletion).
        announce: bool,
    },
    /// The content is invalid: nothing changes. Logged; a Warning Event.
    Invalid {
        /// Every error, with key and line.
        errors: Vec<PoolConfigError>,
        /// Whether an older valid config stays in force (else nothing is planned).
        stale: bool,
    },
}

/// The pool ConfigMap as last handled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigState {
    /// The config in force: the last valid one, or no pools when the controller started
    /// without a ConfigMap; `None` while none is (the loop plans nothing).
    good: Option<PoolConfig>,
    /// `data` last handled; `None` inside: the ConfigMap was missing. `None`: nothing
    /// handled yet.
    seen: Option<Option<BTreeMap<String, String>>>,
    /// Whether the last content handled was invalid.
    invalid: bool,
    /// Whether the ConfigMap is gone after it had been seen (what is in force is older).
    deleted: bool,
    /// The errors of the last content handled, when it was invalid.
    errors: Vec<PoolConfigError>,
}

impl ConfigState {
    /// The state a new leadership term starts from: the config the previous term of this
    /// process had in force (if any) stays in force, and the ConfigMap is handled anew. So a
    /// replica that loses and regains the lead while the ConfigMap is invalid or deleted keeps
    /// the last good config instead of planning nothing.
    pub fn resumed(good: Option<PoolConfig>) -> Self {
        ConfigState {
            good,
            ..ConfigState::default()
        }
    }

    /// The config in force; `None` while no valid config was ever seen (planning on nothing
    /// would clear every assignment).
    pub fn in_force(&self) -> Option<&PoolConfig> {
        self.good.as_ref()
    }

    /// `aliaslb_config_valid`: the ConfigMap as currently written is in force (a missing
    /// one at start counts as "no pools", which is valid; a deleted one is not).
    pub fn valid(&self) -> bool {
        !self.invalid && !self.deleted
    }

    /// `aliaslb_config_stale`: an older config is in force than the ConfigMap says,
    /// because the ConfigMap is invalid or gone.
    pub fn stale(&self) -> bool {
        (self.invalid || self.deleted) && self.good.is_some()
    }

    /// Whether the ConfigMap is gone (deleted after it had been seen, or missing at start
    /// while IPs are assigned).
    pub fn deleted(&self) -> bool {
        self.deleted
    }

    /// The errors of the ConfigMap as last handled (empty unless it is invalid).
    pub fn errors(&self) -> &[PoolConfigError] {
        &self.errors
    }

    /// Whether nothing was handled yet (the next [`observe`](Self::observe) is the first
    /// look, the only one that reads `assigned`).
    pub fn first_look(&self) -> bool {
        self.seen.is_none()
    }

    /// Handles one observation of the ConfigMap; `assigned`: whether anything is assigned
    /// already (read only at the first look). Returns what to publish (`None`: the same as
    /// last time, nothing changed).
    pub fn observe(&mut self, observed: ConfigData<'_>, assigned: bool) -> Option<ConfigNotice> {
        if self
            .seen
            .as_ref()
            .is_some_and(|seen| seen.as_ref() == observed)
        {
            return None;
        }
        let first = self.seen.is_none();
        self.seen = Some(observed.cloned());
        self.errors.clear();
        let Some(data) = observed else {
            if first && assigned {
                self.deleted = true;
                self.invalid = false;
                return Some(ConfigNotice::MissingWithAssignments);
            }
            if first {
                self.good = Some(PoolConfig::parse(&BTreeMap::new()).unwrap_or_else(|_| {
                    unreachable!("an empty ConfigMap is a valid config without pools")
                }));
                self.invalid = false;
                return Some(ConfigNotice::MissingAtStart);
            }
            self.deleted = true;
            self.invalid = false;
            return Some(ConfigNotice::Deleted {
                pools: self.good.as_ref().map(|c| c.pools().count()),
            });
        };
        match PoolConfig::parse(data) {
            Ok(config) => {
                let changed = self.good.as_ref() != Some(&config);
                let announce = !first && (self.invalid || self.deleted || changed);
                let pools = config.pools().count();
                self.good = Some(config);
                self.invalid = false;
                self.deleted = false;
                Some(ConfigNotice::Loaded { pools, announce })
            }
            Err(errors) => {
                self.invalid = true;
                self.deleted = false;
                self.errors.clone_from(&errors);
                Some(ConfigNotice::Invalid {
                    errors,
                    stale: self.good.is_some(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of a table: what the cache shows.
    #[derive(Debug, Clone, Copy)]
    enum Shows {
        /// No ConfigMap.
        Nothing,
        /// One pool `team-a` with `ip`.
        Pool(&'static str),
        /// Pools `team-a` (`ip`) and `team-b`.
        TwoPools(&'static str),
        /// A broken line.
        Broken,
    }

    fn data(shows: Shows) -> Option<BTreeMap<String, String>> {
        let one = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        match shows {
            Shows::Nothing => None,
            Shows::Pool(ip) => Some(BTreeMap::from([one("team-a", ip)])),
            Shows::TwoPools(ip) => Some(BTreeMap::from([
                one("team-a", ip),
                one("team-b", "10.9.0.1"),
            ])),
            Shows::Broken => Some(BTreeMap::from([one("team-a", "not-an-ip")])),
        }
    }

    fn config(shows: Shows) -> PoolConfig {
        PoolConfig::parse(&data(shows).unwrap()).unwrap()
    }

    /// What a step must give: its notice (errors left out) and the state after it.
    #[derive(Debug, PartialEq, Eq)]
    struct After {
        notice: Option<String>,
        in_force: Option<PoolConfig>,
        valid: bool,
        stale: bool,
    }

    fn after(
        notice: Option<&str>,
        in_force: Option<PoolConfig>,
        valid: bool,
        stale: bool,
    ) -> After {
        After {
            notice: notice.map(str::to_owned),
            in_force,
            valid,
            stale,
        }
    }

    fn summary(notice: &ConfigNotice) -> String {
        match notice {
            ConfigNotice::MissingAtStart => "missing at start".into(),
            ConfigNotice::MissingWithAssignments => "missing at start, assigned".into(),
            ConfigNotice::Deleted { pools } => format!("deleted, keeping {pools:?}"),
            ConfigNotice::Loaded { pools, announce } => {
                format!("loaded {pools}, announce {announce}")
            }
            ConfigNotice::Invalid { errors, stale } => {
                format!("invalid {}, stale {stale}", errors.len())
            }
        }
    }

    fn no_pools() -> PoolConfig {
        PoolConfig::parse(&BTreeMap::new()).unwrap()
    }

    fn run(name: &str, steps: &[(Shows, After)]) {
        let mut state = ConfigState::default();
        for (i, (shows, want)) in steps.iter().enumerate() {
            let observed = data(*shows);
            let notice = state.observe(observed.as_ref(), false);
            let got = After {
                notice: notice.as_ref().map(summary),
                in_force: state.in_force().cloned(),
                valid: state.valid(),
                stale: state.stale(),
            };
            assert_eq!(&got, want, "{name}, step {i} ({shows:?})");
        }
    }

    #[test]
    fn which_config_is_in_force() {
        use Shows::*;
        let a1 = || Some(config(Pool("10.0.0.1")));
        let a2 = || Some(config(Pool("10.0.0.2")));
        let ab = || Some(config(TwoPools("10.0.0.1")));
        let table: &[(&str, &[(Shows, After)])] = &[
            (
                "a deletion keeps the config in force until the ConfigMap is back",
                &[
                    (
                        Pool("10.0.0.1"),
                        after(Some("loaded 1, announce false"), a1(), true, false),
                    ),
                    (
                        Nothing,
                        after(Some("deleted, keeping Some(1)"), a1(), false, true),
                    ),
                    // The same deletion seen by later passes: nothing to say again.
                    (Nothing, after(None, a1(), false, true)),
                    (
                        Pool("10.0.0.1"),
                        after(Some("loaded 1, announce true"), a1(), true, false),
                    ),
                    (Pool("10.0.0.1"), after(None, a1(), true, false)),
                ],
            ),
            (
                "re-created with other content: that content is in force",
                &[
                    (
                        Pool("10.0.0.1"),
                        after(Some("loaded 1, announce false"), a1(), true, false),
                    ),
                    (
                        Nothing,
                        after(Some("deleted, keeping Some(1)"), a1(), false, true),
                    ),
                    (
                        Pool("10.0.0.2"),
                        after(Some("loaded 1, announce true"), a2(), true, false),
                    ),
                ],
            ),
            (
                "re-created invalid: still the config from before the deletion",
                &[
                    (
                        Pool("10.0.0.1"),
                        after(Some("loaded 1, announce false"), a1(), true, false),
                    ),
                    (
                        Nothing,
                        after(Some("deleted, keeping Some(1)"), a1(), false, true),
                    ),
                    (
                        Broken,
                        after(Some("invalid 1, stale true"), a1(), false, true),
                    ),
                    (
                        Nothing,
                        after(Some("deleted, keeping Some(1)"), a1(), false, true),
                    ),
                ],
            ),
            (
                "removing a key is an instruction",
                &[
                    (
                        TwoPools("10.0.0.1"),
                        after(Some("loaded 2, announce false"), ab(), true, false),
                    ),
                    (
                        Pool("10.0.0.1"),
                        after(Some("loaded 1, announce true"), a1(), true, false),
                    ),
                ],
            ),
            (
                "no ConfigMap at start: no pools, as before; created later: loaded",
                &[
                    (
                        Nothing,
                        after(Some("missing at start"), Some(no_pools()), true, false),
                    ),
                    (Nothing, after(None, Some(no_pools()), true, false)),
                    (
                        Pool("10.0.0.1"),
                        after(Some("loaded 1, announce true"), a1(), true, false),
                    ),
                    (
                        Nothing,
                        after(Some("deleted, keeping Some(1)"), a1(), false, true),
                    ),
                ],
            ),
            (
                "invalid at start, then deleted: still nothing in force",
                &[
                    (
                        Broken,
                        after(Some("invalid 1, stale false"), None, false, false),
                    ),
                    (
                        Nothing,
                        after(Some("deleted, keeping None"), None, false, false),
                    ),
                    (
                        Pool("10.0.0.1"),
                        after(Some("loaded 1, announce true"), a1(), true, false),
                    ),
                ],
            ),
            (
                "an invalid edit keeps the last valid config; the same content back is announced",
                &[
                    (
                        Pool("10.0.0.1"),
                        after(Some("loaded 1, announce false"), a1(), true, false),
                    ),
                    (
                        Broken,
                        after(Some("invalid 1, stale true"), a1(), false, true),
                    ),
                    (Broken, after(None, a1(), false, true)),
                    (
                        Pool("10.0.0.1"),
                        after(Some("loaded 1, announce true"), a1(), true, false),
                    ),
                ],
            ),
        ];
        for (name, steps) in table {
            run(name, steps);
        }
    }

    #[test]
    fn a_new_term_keeps_the_last_good_config_of_the_previous_one() {
        // The term before had the pool in force; the ConfigMap turned invalid meanwhile.
        let mut previous = ConfigState::default();
        previous.observe(data(Shows::Pool("10.0.0.1")).as_ref(), false);
        let mut next = ConfigState::resumed(previous.in_force().cloned());
        let notice = next.observe(data(Shows::Broken).as_ref(), true);
        assert!(
            matches!(notice, Some(ConfigNotice::Invalid { stale: true, .. })),
            "{notice:?}"
        );
        assert_eq!(next.in_force(), Some(&config(Shows::Pool("10.0.0.1"))));
        // A term of a process that never saw a good config has none (as at start).
        let mut fresh = ConfigState::resumed(None);
        fresh.observe(data(Shows::Broken).as_ref(), true);
        assert_eq!(fresh.in_force(), None);
    }

    #[test]
    fn an_empty_configmap_is_not_a_missing_one() {
        let mut state = ConfigState::default();
        state.observe(data(Shows::Pool("10.0.0.1")).as_ref(), false);
        let empty = BTreeMap::new();
        assert_eq!(
            state.observe(Some(&empty), false),
            Some(ConfigNotice::Loaded {
                pools: 0,
                announce: true
            }),
            "an object without keys is an edit that removed them all"
        );
        assert_eq!(state.in_force(), Some(&no_pools()));
        assert!(!state.stale());
    }

    #[test]
    fn a_start_without_configmap_while_ips_are_assigned_plans_nothing_until_it_is_back() {
        let mut state = ConfigState::default();
        assert_eq!(
            state.observe(None, true),
            Some(ConfigNotice::MissingWithAssignments)
        );
        assert_eq!(state.in_force(), None, "nothing planned, nothing released");
        assert!(!state.valid());
        assert_eq!(state.observe(None, true), None, "said once");
        let back = data(Shows::Pool("10.0.0.1"));
        assert_eq!(
            state.observe(back.as_ref(), true),
            Some(ConfigNotice::Loaded {
                pools: 1,
                announce: true
            })
        );
        assert!(state.in_force().is_some() && state.valid() && !state.stale());
        // Only the first look asks: a later deletion is a deletion.
        assert!(matches!(
            state.observe(None, false),
            Some(ConfigNotice::Deleted { .. })
        ));
    }
}
