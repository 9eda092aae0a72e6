//! The example configuration parses into the real config types, with the
//! same layering the binaries use.

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use shoal_coordinator::CoordinatorConfig;
use shoal_shard_node::ShardNodeConfig;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/shoal.example.toml");

#[test]
fn the_example_config_parses_and_shows_the_defaults() {
    let coord: CoordinatorConfig = Figment::from(Serialized::defaults(CoordinatorConfig::default()))
        .merge(Figment::from(Toml::file(EXAMPLE)).focus("coordinator"))
        .extract()
        .expect("coordinator section");
    assert_eq!(coord.shard_nodes.len(), 2);
    let defaults = CoordinatorConfig { shard_nodes: coord.shard_nodes.clone(), ..CoordinatorConfig::default() };
    assert_eq!(coord, defaults, "the example's coordinator values drifted from the defaults");

    let shard: ShardNodeConfig = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
        .merge(Figment::from(Toml::file(EXAMPLE)).focus("shard_node"))
        .extract()
        .expect("shard_node section");
    assert_eq!(shard, ShardNodeConfig::default(), "the example's shard node values drifted from the defaults");
}

#[test]
fn unknown_keys_are_errors_not_silently_ignored() {
    let err = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
        .merge(Toml::string("[engine]\ndurabel = false\n"))
        .extract::<ShardNodeConfig>()
        .unwrap_err();
    assert!(err.to_string().contains("durabel"), "{err}");
}

#[test]
fn a_vacuum_ratio_outside_0_to_1_is_refused_by_name() {
    for bad in ["0.0", "1.5", "-0.2", "nan"] {
        let err = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
            .merge(Toml::string(&format!("[engine]\nvacuum_ratio = {bad}\n")))
            .extract::<ShardNodeConfig>()
            .unwrap_err();
        assert!(err.to_string().contains("vacuum_ratio") && err.to_string().contains("at most 1"), "{bad}: {err}");
    }
    let ok: ShardNodeConfig = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
        .merge(Toml::string("[engine]\nvacuum_ratio = 0.5\n"))
        .extract()
        .unwrap();
    assert_eq!(ok.engine.index_options().vacuum_ratio, 0.5);
}

#[test]
fn the_warm_share_is_a_share_of_memory_and_0_turns_warming_off() {
    for bad in ["1.5", "-0.1", "nan"] {
        let err = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
            .merge(Toml::string(&format!("[engine]\nwarm_max_share = {bad}\n")))
            .extract::<ShardNodeConfig>()
            .unwrap_err();
        assert!(err.to_string().contains("warm_max_share") && err.to_string().contains("from 0 to 1"), "{bad}: {err}");
    }
    let share = |s: &str| -> u64 {
        let cfg: ShardNodeConfig = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
            .merge(Toml::string(&format!("[engine]\nwarm_max_share = {s}\n")))
            .extract()
            .unwrap();
        cfg.engine.index_options().warm_max_bytes
    };
    assert_eq!(share("0.0"), 0, "0 never warms");
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let total_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    let (half, all) = (share("0.5"), share("1.0"));
    assert!(half > 0 && all <= total_kb * 1024, "half {half}, all {all}, MemTotal {total_kb} kB");
    assert!(half.abs_diff(all / 2) <= 1, "half {half} of all {all}");
}

#[test]
fn a_negative_batch_log_share_or_fold_ratio_is_refused_by_name() {
    for key in ["batch_log_max_share", "idle_fold_ratio"] {
        for bad in ["-1.0", "nan", "inf"] {
            let err = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
                .merge(Toml::string(&format!("[engine]\n{key} = {bad}\n")))
                .extract::<ShardNodeConfig>()
                .unwrap_err();
            assert!(err.to_string().contains(key) && err.to_string().contains("0 or more"), "{key} = {bad}: {err}");
        }
    }
    let ok: ShardNodeConfig = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
        .merge(Toml::string(
            "[engine]\nbatch_log_max_share = 0.5\nbatch_log_min_bytes = 1024\nidle_fold_ratio = 0.25\nwrite_memory_bytes = 0\n",
        ))
        .extract()
        .unwrap();
    let opts = ok.engine.index_options();
    assert_eq!((opts.batch_log.max_share, opts.batch_log.min_bytes, opts.idle_fold_ratio), (0.5, 1024, 0.25));
    assert_eq!(opts.write_memory_bytes, 0);
    assert_ne!(ShardNodeConfig::default().engine.index_options().write_memory_bytes, 0);
}

#[test]
// figment's `Jail` closure returns figment's own (large) error type.
#[allow(clippy::result_large_err)]
fn environment_overrides_the_file() {
    figment::Jail::expect_with(|jail| {
        jail.set_env("SHOAL_SHARD_ENGINE__DURABLE", "false");
        jail.set_env("SHOAL_SHARD_LISTEN", "127.0.0.1:9999");
        let cfg: ShardNodeConfig = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
            .merge(Figment::from(Toml::file(EXAMPLE)).focus("shard_node"))
            .merge(figment::providers::Env::prefixed("SHOAL_SHARD_").split("__"))
            .extract()?;
        assert!(!cfg.engine.durable);
        assert_eq!(cfg.listen.port(), 9999);
        Ok(())
    });
}

/// TLS to etcd from the environment, as docs/security.md lists it.
#[test]
#[allow(clippy::result_large_err)]
fn etcd_tls_settings_come_from_the_environment() {
    figment::Jail::expect_with(|jail| {
        jail.set_env("SHOAL_COORD_CLUSTER__ETCD", "[\"https://10.0.0.5:2379\"]");
        jail.set_env("SHOAL_COORD_CLUSTER__TLS__CA_FILE", "/etc/shoal/etcd/ca.pem");
        jail.set_env("SHOAL_COORD_CLUSTER__TLS__CERT_FILE", "/etc/shoal/etcd/c.pem");
        jail.set_env("SHOAL_COORD_CLUSTER__TLS__KEY_FILE", "/etc/shoal/etcd/k.pem");
        jail.set_env("SHOAL_SHARD_CLUSTER__TLS__CA_FILE", "/etc/shoal/etcd/ca.pem");
        let coord: CoordinatorConfig = Figment::from(Serialized::defaults(CoordinatorConfig::default()))
            .merge(Figment::from(Toml::file(EXAMPLE)).focus("coordinator"))
            .merge(figment::providers::Env::prefixed("SHOAL_COORD_").split("__"))
            .extract()?;
        assert_eq!(coord.cluster.etcd, ["https://10.0.0.5:2379"]);
        let tls = &coord.cluster.tls;
        assert_eq!(tls.ca_file.as_deref(), Some(std::path::Path::new("/etc/shoal/etcd/ca.pem")));
        assert_eq!(tls.cert_file.as_deref(), Some(std::path::Path::new("/etc/shoal/etcd/c.pem")));
        assert_eq!(tls.key_file.as_deref(), Some(std::path::Path::new("/etc/shoal/etcd/k.pem")));
        let shard: ShardNodeConfig = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
            .merge(Figment::from(Toml::file(EXAMPLE)).focus("shard_node"))
            .merge(figment::providers::Env::prefixed("SHOAL_SHARD_").split("__"))
            .extract()?;
        assert_eq!(shard.cluster.tls.ca_file.as_deref(), Some(std::path::Path::new("/etc/shoal/etcd/ca.pem")));
        assert_eq!(shard.cluster.tls.cert_file, None);
        Ok(())
    });
}

/// Config files are input from outside too: the example damaged anywhere
/// (bytes flipped, cut, a line duplicated) and random text either load or
/// are refused with an error, never a panic, for both sections.
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    fn cases() -> u32 {
        std::env::var("SHOAL_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    }

    fn load(text: &str) {
        let _ = Figment::from(Serialized::defaults(CoordinatorConfig::default()))
            .merge(Figment::from(Toml::string(text)).focus("coordinator"))
            .extract::<CoordinatorConfig>();
        let _ = Figment::from(Serialized::defaults(ShardNodeConfig::default()))
            .merge(Figment::from(Toml::string(text)).focus("shard_node"))
            .extract::<ShardNodeConfig>();
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn fuzz_config_files(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in any::<prop::sample::Index>(),
            dup in any::<prop::sample::Index>(),
            random in "\\PC{0,200}",
        ) {
            let example = std::fs::read(EXAMPLE).unwrap();
            let mut bytes = example.clone();
            for (at, b) in flips {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            load(&String::from_utf8_lossy(&bytes));
            let lines: Vec<&str> = std::str::from_utf8(&example).unwrap().lines().collect();
            let mut doubled = lines.clone();
            let d = dup.index(lines.len());
            doubled.insert(d, lines[d]);
            load(&doubled.join("\n"));
            load(&String::from_utf8_lossy(&example[..cut.index(example.len())]));
            load(&random);
        }
    }
}
