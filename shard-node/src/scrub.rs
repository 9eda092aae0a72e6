//! The background scrub: every stored value of every shard this node
//! holds is read back and checked against its checksum
//! (`shoal_engine::Index::scrub`), one bounded step at a time, paced to
//! `scrub.bytes_per_second` for the whole node, since its shards share a
//! disk. Shards take turns, one whole pass each.
//!
//! A copy found damaged is taken out of service at once
//! (`ShardHost::set_damaged`): its requests answer DATA_LOSS, which the
//! coordinator answers from another replica, and `ListShards` names it,
//! which is how the controller learns to make it again from a good copy.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use shoal_engine::{Error as EngineError, ScrubCursor};
use tokio::task::JoinHandle;

use crate::config::ScrubConfig;
use crate::host::{ShardHost, ShardKey};

/// How long the scrub waits when the node holds no shard.
const IDLE: Duration = Duration::from_secs(1);

/// Starts the scrub of `host`'s shards; `None` if it is turned off. It
/// ends with the host.
pub(crate) fn spawn(host: &Arc<ShardHost>, cfg: &ScrubConfig) -> Option<JoinHandle<()>> {
    (cfg.bytes_per_second > 0).then(|| tokio::spawn(run(Arc::downgrade(host), cfg.clone())))
}

async fn run(host: Weak<ShardHost>, cfg: ScrubConfig) {
    // Where each copy's pass has got to, by shard and copy id: a copy made
    // again starts its own pass.
    let mut cursors: HashMap<(ShardKey, u64), ScrubCursor> = HashMap::new();
    let mut turn = 0usize;
    loop {
        let Some(h) = host.upgrade() else { return };
        if h.is_closing() {
            return;
        }
        let mut shards = h.shards_now();
        if shards.is_empty() {
            drop(h);
            tokio::time::sleep(IDLE).await;
            continue;
        }
        shards.sort_by(|a, b| a.0.cmp(&b.0));
        cursors.retain(|(k, copy), _| shards.iter().any(|(key, s)| key == k && s.copy == *copy));
        let (key, copy, index) = {
            let (key, shard) = &shards[turn % shards.len()];
            (key.clone(), shard.copy, Arc::clone(&shard.index))
        };
        // Nothing of the shards held across the step: taking a damaged
        // copy out waits for the last user of its index to go.
        drop(shards);
        let at = (key.clone(), copy);
        let cursor = cursors.get(&at).cloned().unwrap_or_default();
        let step_bytes = cfg.step_bytes.max(1);
        let labels = crate::metrics::labels(&key);
        let result = tokio::task::spawn_blocking(move || index.scrub(&cursor, step_bytes)).await;
        let mut read = 0;
        match result {
            Ok(Ok(step)) => {
                read = step.bytes;
                let m = crate::metrics::get();
                m.scrubbed_bytes.add(step.bytes, &labels);
                if step.pass_done {
                    m.scrub_passes.add(1, &labels);
                    tracing::debug!(collection = %key.0, shard = key.1, "scrub pass done");
                    turn = turn.wrapping_add(1);
                }
                cursors.insert(at, step.next);
            }
            Ok(Err(e @ EngineError::Corrupt { .. })) => {
                let why = format!("the scrub found: {e}");
                tracing::error!(
                    collection = %key.0, shard = key.1, error = %e,
                    "a shard copy is damaged: it is no longer served; the controller seeds it anew from another replica, or restore it from a snapshot (docs/runbooks/a-copy-is-damaged.md)"
                );
                crate::metrics::get().scrub_damage.add(1, &labels);
                cursors.remove(&at);
                h.set_damaged(&key, copy, why).await;
                turn = turn.wrapping_add(1);
            }
            // A shard closing under the step, or a read error that is not
            // damage: tried again after a step's pause, never in a spin.
            Ok(Err(e)) => {
                tracing::debug!(collection = %key.0, shard = key.1, error = %e, "scrub step failed");
                read = step_bytes;
            }
            Err(e) => {
                tracing::warn!(collection = %key.0, shard = key.1, error = %e, "scrub step panicked");
                read = step_bytes;
            }
        }
        drop(h);
        let pause = Duration::from_secs_f64(read.max(1) as f64 / cfg.bytes_per_second as f64);
        tokio::time::sleep(pause).await;
    }
}
