//! The process's own gauges, the names Prometheus client libraries use:
//! resident memory, open file descriptors, and the build; and the worker
//! threads of the runtime it serves on.

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

/// Registers the gauges on `meter` (their callbacks read /proc when
/// metrics are collected).
pub(crate) fn register(meter: &Meter) {
    let _ = meter
        .u64_observable_gauge("process.resident_memory")
        .with_unit("By")
        .with_description("Resident memory of the process (RSS)")
        .with_callback(|obs| {
            if let Some(kib) = status_kib("VmRSS:") {
                obs.observe(kib * 1024, &[]);
            }
        })
        .build();
    let _ = meter
        .u64_observable_gauge("process.open_fds")
        .with_description("Open file descriptors of the process")
        .with_callback(|obs| {
            if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
                obs.observe(dir.count() as u64, &[]);
            }
        })
        .build();
    // Fixed for the process's life: read once, on the runtime registering.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let workers = rt.metrics().num_workers() as u64;
        let _ = meter
            .u64_observable_gauge("shoal.runtime.worker_threads")
            .with_description("Threads of the runtime serving requests (worker_threads)")
            .with_callback(move |obs| obs.observe(workers, &[]))
            .build();
    }
    let _ = meter
        .u64_observable_gauge("shoal.build.info")
        .with_description("Always 1; the labels say which build runs")
        .with_callback(|obs| obs.observe(1, &[KeyValue::new("version", env!("CARGO_PKG_VERSION"))]))
        .build();
}

fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()
}
