//! Configuration layering, the same for every process: defaults, then one
//! section of a TOML file, then environment variables, then flags.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Loads `T` from its defaults, the `[section]` of `file` (if given), the
/// variables starting with `env_prefix` (nested keys joined by `__`, e.g.
/// `SHOAL_SHARD_ENGINE__DURABLE`), and `flags` (a struct whose fields that
/// were given serialize as the config's keys; absent ones are skipped).
pub fn load<T>(file: Option<&Path>, section: &str, env_prefix: &str, flags: &impl Serialize) -> anyhow::Result<T>
where
    T: Default + Serialize + DeserializeOwned,
{
    let mut fig = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = file {
        anyhow::ensure!(path.is_file(), "config file {} does not exist", path.display());
        fig = fig.merge(Figment::from(Toml::file(path)).focus(section));
    }
    Ok(fig.merge(Env::prefixed(env_prefix).split("__")).merge(Serialized::globals(flags)).extract()?)
}
