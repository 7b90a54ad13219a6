//! Table tests for the pool ConfigMap beyond the classic format: named pools (`pool.NAME`)
//! and who may draw from them, the default of a namespace, draining entries and pools,
//! `autoAssign: false`, the `aliaslb.io/pool` names, and every new mistake with its line.

use std::collections::BTreeMap;

use aliaslb_core::pool::{Labels, PoolConfig, PoolConfigError, PoolKey};
use aliaslb_core::range::Family;

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn valid(pairs: &[(&str, &str)]) -> PoolConfig {
    PoolConfig::parse(&data(pairs)).unwrap_or_else(|e| panic!("expected valid, got {e:#?}"))
}

fn errors(pairs: &[(&str, &str)]) -> Vec<String> {
    match PoolConfig::parse(&data(pairs)) {
        Ok(config) => panic!("expected errors, got {config:?}"),
        Err(errors) => errors.iter().map(PoolConfigError::to_string).collect(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn named(name: &str) -> PoolKey {
    PoolKey::Named(format!("pool.{name}").into())
}

/// The keys a namespace may draw from, in default order, and its default.
fn tenancy(config: &PoolConfig, ns: &str, l: &Labels) -> (Vec<String>, Option<String>) {
    let t = config.tenancy(ns, Some(l));
    (
        t.pools().iter().map(|(k, _)| k.to_string()).collect(),
        t.default_pool().map(|(k, _)| k.to_string()),
    )
}

/// A ConfigMap with an own key, three named pools (listed in config.yaml as b, a, manual)
/// and a fallback.
fn example() -> PoolConfig {
    valid(&[
        ("team-a", "10.0.1.0/30"),
        ("pool.a", "10.0.2.1-10.0.2.4"),
        ("pool.b", "10.0.3.1-10.0.3.4\n2001:db8:3::/126"),
        ("pool.manual", "203.0.113.1-203.0.113.4"),
        ("pool.nobody", "10.0.5.1"),
        ("_fallback", "10.0.9.1-10.0.9.4"),
        (
            "config.yaml",
            "pools:\n  pool.b:\n    namespaceSelector: {tier: web}\n  pool.a:\n    namespaces: [team-a, team-b]\n    announce: bgp\n  pool.manual:\n    namespaces: [team-a, team-c]\n    autoAssign: false\n",
        ),
    ])
}

#[test]
fn who_may_draw_from_what_and_the_default() {
    let config = example();
    let web = labels(&[("tier", "web")]);
    let none = Labels::new();
    for (ns, l, pools, default) in [
        // Its own key first and the default; named pools in config.yaml order; no fallback.
        (
            "team-a",
            &web,
            vec!["team-a", "pool.b", "pool.a", "pool.manual"],
            Some("team-a"),
        ),
        (
            "team-a",
            &none,
            vec!["team-a", "pool.a", "pool.manual"],
            Some("team-a"),
        ),
        // No key of its own: named pools, then the fallback.
        ("team-b", &none, vec!["pool.a", "_fallback"], Some("pool.a")),
        (
            "team-b",
            &web,
            vec!["pool.b", "pool.a", "_fallback"],
            Some("pool.b"),
        ),
        // Only a manual pool: the fallback is the default.
        (
            "team-c",
            &none,
            vec!["pool.manual", "_fallback"],
            Some("_fallback"),
        ),
        ("other", &none, vec!["_fallback"], Some("_fallback")),
    ] {
        let got = tenancy(&config, ns, l);
        let want = (
            pools.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
            default.map(str::to_owned),
        );
        assert_eq!(got, want, "{ns} {l:?}");
    }
    let options = &config.pool(&named("a")).unwrap().options;
    assert_eq!(options.namespaces, ["team-a", "team-b"]);
    assert_eq!(options.announce, aliaslb_core::pool::Announce::Bgp);
    let order: Vec<String> = config.named().map(|(k, _)| k.to_string()).collect();
    assert_eq!(
        order,
        ["pool.b", "pool.a", "pool.manual"],
        "config.yaml order"
    );
    assert_eq!(
        config.selected_by(&web),
        [&named("b")],
        "selected by labels"
    );
    assert!(config.selects_namespaces());
    assert_eq!(
        config
            .pool_of("10.0.3.2".parse().unwrap())
            .map(|(k, _)| k.clone()),
        Some(named("b"))
    );
    // A namespace with no pool at all.
    let lonely = valid(&[("team-a", "10.0.0.1")]);
    assert!(lonely.tenancy("team-z", None).is_empty());
}

#[test]
fn a_relabelled_namespace_keeps_what_a_selector_gave_it() {
    let config = example();
    let b = (config.keyed(&named("b")).unwrap()).1;
    let manual = config.pool(&named("manual")).unwrap();
    let unlabelled = config.tenancy("team-b", None);
    assert!(!unlabelled.may_draw(&named("b")));
    assert!(unlabelled.keeps(&named("b"), b), "a selector pool keeps");
    assert!(
        !unlabelled.keeps(&named("manual"), manual),
        "a list pool does not"
    );
    let own = config.pool(&PoolKey::Namespace("team-a".into())).unwrap();
    assert!(
        !unlabelled.keeps(&PoolKey::Namespace("team-a".into()), own),
        "another namespace's own key never"
    );
}

#[test]
fn the_pool_a_service_names() {
    for (value, want) in [
        ("internal", Some(named("internal"))),
        ("pool.internal", Some(named("internal"))),
        (" internal ", Some(named("internal"))),
        ("_fallback", Some(PoolKey::Fallback)),
        ("Internal", None),
        ("pool.", None),
        ("", None),
        ("a/b", None),
    ] {
        assert_eq!(PoolKey::from_annotation(value), want, "{value:?}");
    }
    assert_eq!(named("internal").name(), "internal");
    assert_eq!(named("internal").as_str(), "pool.internal");
    assert_eq!(PoolKey::Fallback.name(), "_fallback");
}

#[test]
fn draining_entries_and_pools() {
    let config = valid(&[
        (
            "team-a",
            "10.0.1.0/30 draining   # the old range\n10.0.2.1-10.0.2.4\n10.0.3.7\tdraining",
        ),
        ("pool.old", "10.0.4.1-10.0.4.4"),
        (
            "config.yaml",
            "pools:\n  pool.old:\n    namespaces: [team-a]\n    draining: true\n",
        ),
    ]);
    let pool = config.pool(&PoolKey::Namespace("team-a".into())).unwrap();
    let texts: Vec<(&str, bool)> = pool
        .entries
        .iter()
        .map(|e| (e.text.as_str(), e.draining))
        .collect();
    assert_eq!(
        texts,
        [
            ("10.0.1.0/30", true),
            ("10.0.2.1-10.0.2.4", false),
            ("10.0.3.7", true)
        ]
    );
    assert_eq!(
        pool.size(Family::V4),
        7,
        "draining addresses are still the pool's"
    );
    assert!(pool.is_closed("10.0.1.2".parse().unwrap()));
    assert!(!pool.is_closed("10.0.2.2".parse().unwrap()));
    assert!(pool.is_open() && pool.assigns_unasked());
    let old = config.pool(&named("old")).unwrap();
    assert!(old.is_closed("10.0.4.3".parse().unwrap()));
    assert!(!old.is_open(), "a draining pool hands nothing out anew");
    let (pools, default) = tenancy(&config, "team-a", &Labels::new());
    assert_eq!(pools, ["team-a", "pool.old"]);
    assert_eq!(default.as_deref(), Some("team-a"));
    // Every entry draining: the pool is closed too, and no namespace's default.
    let all = valid(&[("team-a", "10.0.1.1 draining\n10.0.1.2 draining")]);
    let pool = all.pool(&PoolKey::Namespace("team-a".into())).unwrap();
    assert!(!pool.is_open());
    assert_eq!(tenancy(&all, "team-a", &Labels::new()).1, None);
}

/// A ConfigMap's `data` as `(key, value)` pairs.
type Data<'a> = &'a [(&'a str, &'a str)];

#[test]
fn every_new_mistake_names_its_key_and_line() {
    let table: &[(Data<'_>, &[&str])] = &[
        (
            &[("pool.Internal", "10.0.0.1")],
            &[
                "key pool.Internal: not a valid named pool key: `pool.` is followed by the pool's name, at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit; did you mean `pool.internal`?",
            ],
        ),
        (
            &[("pools.internal", "10.0.0.1")],
            &[
                "key pools.internal: not a valid pool key: keys are namespace names (DNS-1123 labels: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit), `_fallback` or `config.yaml`; a named pool's key is `pool.` and its name, e.g. `pool.internal`",
            ],
        ),
        (
            &[("pool.empty", "# nothing yet")],
            &[
                "key pool.empty: the pool is empty: list at least one address, CIDR or range, or remove the key (a Service that names it would stay pending)",
            ],
        ),
        (
            &[("team-a", "10.0.0.1 drainig")],
            &[
                "key team-a, line 1: `drainig` is not a word an entry takes: the only one is `draining`, after the entry (`10.0.7.0/29 draining`) (`10.0.0.1 drainig`)",
            ],
        ),
        (
            &[
                ("team-a", "10.0.0.1"),
                (
                    "config.yaml",
                    "pools:\n  team-a:\n    namespaces: [team-b]\n",
                ),
            ],
            &[
                "key config.yaml, line 3: not valid options YAML: pools.team-a: unknown field `namespaces`, expected one of `interface`, `nodeSelector`, `allowSharing`, `announce`, `maxNodes`, `onConflict`, `virtualMAC` at line 3 column 5; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC`; `namespaces` applies to named pools (`pool.NAME`) only: a namespace's own key serves that namespace, `_fallback` every namespace without a key (to drain an entry, write `draining` after it) (`namespaces: [team-b]`)",
            ],
        ),
        (
            &[
                ("pool.x", "10.0.0.1"),
                (
                    "config.yaml",
                    "pools:\n  pool.x:\n    namespaceSelector: {}\n    namespaces: [Team-B, team-c, team-c]\n",
                ),
            ],
            &[
                "key config.yaml, line 2: pool `pool.x`: namespaces: `Team-B` is not a namespace name (at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit) (`pool.x:`)",
                "key config.yaml, line 2: pool `pool.x`: namespaces: `team-c` is listed twice; list each namespace once (`pool.x:`)",
                "key config.yaml, line 2: pool `pool.x`: an empty `namespaceSelector` would let every namespace draw from the pool; give labels the namespaces must carry, or list them in `namespaces` (`pool.x:`)",
            ],
        ),
        (
            &[
                ("pool.x", "10.0.0.1"),
                (
                    "config.yaml",
                    "pools:\n  pool.x:\n    namespaceSelector: {\"bad key!\": a}\n",
                ),
            ],
            &[
                "key config.yaml, line 2: pool `pool.x`: namespaceSelector `bad key!: a`: label name `bad key!` must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (`pool.x:`)",
            ],
        ),
        (
            &[
                ("pool.x", "10.0.0.1"),
                (
                    "config.yaml",
                    "pools:\n  pool.x:\n    autoAssign: sometimes\n",
                ),
            ],
            &[
                "key config.yaml, line 3: not valid options YAML: pools.pool.x.autoAssign: invalid type: string \"sometimes\", expected a boolean at line 3 column 17; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC`, and for a named pool `namespaces`, `namespaceSelector`, `autoAssign` and `draining` (`autoAssign: sometimes`)",
            ],
        ),
        (
            &[
                ("pool.x", "10.0.0.1"),
                ("config.yaml", "pools:\n  pool.x: {}\n  pool.x: {}\n"),
            ],
            &[
                "key config.yaml, line 2: not valid options YAML: pools: `pool.x` is listed twice: give each pool's options once at line 2 column 3; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC` (`pool.x: {}`)",
            ],
        ),
        (
            &[(
                "config.yaml",
                "pools:\n  pool.ghost:\n    namespaces: [a]\n",
            )],
            &[
                "key config.yaml, line 2: options for `pool.ghost`, which has no pool: add a `pool.ghost` key with its addresses, or remove these options (`pool.ghost:`)",
            ],
        ),
        (
            &[("team-a", "10.0.0.1"), ("pool.x", "10.0.0.1 draining")],
            &[
                "key team-a, line 1: overlaps key pool.x, line 1 (`10.0.0.1`): an address can belong to one pool only; remove it from one of the two keys (`10.0.0.1`)",
            ],
        ),
    ];
    for (pairs, want) in table {
        assert_eq!(errors(pairs), *want, "{pairs:?}");
    }
}

#[test]
fn a_classic_configmap_has_no_named_pool_and_no_selector() {
    let config = valid(&[
        ("default", "192.168.55.10\n192.168.55.11"),
        ("_fallback", "10.0.9.0/28"),
        (
            "config.yaml",
            "pools:\n  default:\n    allowSharing: false\n",
        ),
    ]);
    assert_eq!(config.named().count(), 0);
    assert!(!config.selects_namespaces());
    // Exactly the classic rule: own key, else the fallback.
    let (pools, default) = tenancy(&config, "default", &Labels::new());
    assert_eq!(
        (pools, default.as_deref()),
        (vec!["default".to_owned()], Some("default"))
    );
    let (pools, default) = tenancy(&config, "other", &Labels::new());
    assert_eq!(
        (pools, default.as_deref()),
        (vec!["_fallback".to_owned()], Some("_fallback"))
    );
    for (_, pool) in config.pools() {
        assert!(pool.options.auto_assign && !pool.options.draining && pool.draining.is_empty());
    }
}
