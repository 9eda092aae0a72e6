//! `disk-compare`: `disk-bench` and `hannoy-cold` results side by side, one
//! row per (library, readahead, mode), with bytes read as a ratio to the
//! reference library in the same mode.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::Value;

/// Flags of `disk-compare`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// JSON files written by `disk-bench` or `hannoy-cold`.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The library the byte ratios are taken against (its "lib" name).
    #[arg(long, default_value = "hannoy")]
    against: String,
}

pub(crate) fn run(a: Args) -> Result<()> {
    let runs: Vec<Value> = a
        .files
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
        })
        .collect::<Result<_>>()?;
    print!("{}", table(&runs, &a.against));
    Ok(())
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// Bytes read per inserted vector or per query: what reached the slowfs
/// when the run was on one (the process's `read_bytes` is zero on FUSE),
/// else the process's `read_bytes`.
fn bytes_per(run: &Value, file: &Value, op: &str) -> Option<f64> {
    let n = num(&file["params"][if op == "insert" { "inserts" } else { "queries" }]);
    match (num(&run[op]["slowfs_read_bytes"]), n) {
        (Some(b), Some(n)) if n > 0.0 => Some(b / n),
        _ => num(&run[op][if op == "insert" { "per_vector" } else { "per_query" }]["read_bytes"]),
    }
}

fn label(file: &Value, mode: &str) -> String {
    let ra = if file["params"]["read_ahead"].as_bool() == Some(true) { "ra on" } else { "ra off" };
    let slow =
        if file["runs"].as_array().is_some_and(|r| r.iter().any(|r| r["insert"]["slowfs_reads"].is_number())) { " slowfs" } else { "" };
    format!("{} {ra} {mode}{slow}", file["lib"].as_str().unwrap_or("?"))
}

/// Renders the table; ratios are against the first run of `against` in the
/// same mode.
pub(crate) fn table(files: &[Value], against: &str) -> String {
    let reference = |mode: &str| -> Option<&Value> {
        files
            .iter()
            .filter(|f| f["lib"].as_str() == Some(against))
            .flat_map(|f| f["runs"].as_array().into_iter().flatten())
            .find(|r| r["mode"].as_str() == Some(mode))
    };
    let cell = |x: Option<f64>, reference: Option<f64>, scale: f64, digits: usize| -> String {
        match (x, reference) {
            (Some(x), Some(b)) if b > 0.0 => format!("{:.digits$} ({:.2}x)", x / scale, x / b),
            (Some(x), _) => format!("{:.digits$}", x / scale),
            _ => "-".into(),
        }
    };
    let headers = [
        "run",
        "ins KiB/vec",
        "ins faults/vec",
        "ins pages/vec",
        "ins ms (batch)",
        "ins model ms/vec",
        "q KiB",
        "q faults",
        "q pages",
        "q ms",
        "q model ms",
        "recall",
    ];
    let widths = [24, 16, 15, 14, 15, 17, 16, 10, 9, 9, 11, 7];
    let mut out = String::new();
    let mut row = |cells: &[String]| {
        for (c, w) in cells.iter().zip(widths) {
            out += &format!("{c:<w$} ");
        }
        out = out.trim_end().to_string();
        out.push('\n');
    };
    row(&headers.map(String::from));
    for file in files {
        for r in file["runs"].as_array().into_iter().flatten() {
            let mode = r["mode"].as_str().unwrap_or("?");
            let b = reference(mode);
            let (i, s) = (&r["insert"]["per_vector"], &r["search"]["per_query"]);
            let bi = b.and_then(|b| bytes_per(b, file, "insert"));
            let bs = b.and_then(|b| bytes_per(b, file, "search"));
            let is_ref = file["lib"].as_str() == Some(against);
            row(&[
                label(file, mode),
                cell(bytes_per(r, file, "insert"), if is_ref { None } else { bi }, 1024.0, 1),
                cell(num(&i["major_faults"]), None, 1.0, 2),
                cell(num(&i["pages_touched"]), None, 1.0, 2),
                cell(num(&r["insert"]["wall_ms"]), None, 1.0, 0),
                cell(num(&i["modelled_disk_ms"]), None, 1.0, 2),
                cell(bytes_per(r, file, "search"), if is_ref { None } else { bs }, 1024.0, 1),
                cell(num(&s["major_faults"]), None, 1.0, 1),
                cell(num(&s["pages_touched"]), None, 1.0, 1),
                cell(num(&s["wall_ms"]), None, 1.0, 3),
                cell(num(&s["modelled_disk_ms"]), None, 1.0, 1),
                cell(num(&r["search"]["recall"]), None, 1.0, 4),
            ]);
        }
    }
    // The memory target: the insert in the cgroup against warm.
    for file in files {
        let runs = file["runs"].as_array();
        let wall = |mode: &str| {
            runs.and_then(|rs| rs.iter().find(|r| r["mode"].as_str() == Some(mode))).and_then(|r| num(&r["insert"]["wall_ms"]))
        };
        if let (Some(c), Some(w)) = (wall("cgroup"), wall("warm")) {
            let fraction = file["params"]["memory_fraction"].as_f64().unwrap_or(f64::NAN);
            out += &format!(
                "{}: insert in a cgroup of {fraction} x the environment / warm: {:.0} / {:.0} ms = {:.2}x\n",
                label(file, "").trim_end(),
                c,
                w,
                c / w
            );
        }
        for s in file["skipped"].as_array().into_iter().flatten() {
            out += &format!(
                "{}: skipped {}: {}\n",
                label(file, "").trim_end(),
                s["mode"].as_str().unwrap_or("?"),
                s["reason"].as_str().unwrap_or("?")
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::table;

    fn run(mode: &str, ins_bytes: f64, q_bytes: f64, wall: f64) -> serde_json::Value {
        json!({"mode": mode,
               "insert": {"wall_ms": wall, "per_vector": {"read_bytes": ins_bytes, "major_faults": 1.0, "pages_touched": 1.0, "modelled_disk_ms": 1.0}},
               "search": {"recall": 0.95, "per_query": {"read_bytes": q_bytes, "major_faults": 2.0, "pages_touched": 2.0, "wall_ms": 0.5, "modelled_disk_ms": 2.0}}})
    }

    #[test]
    fn byte_ratios_are_against_the_reference_in_the_same_mode_and_the_cgroup_ratio_is_printed() {
        let shoal = json!({"lib": "shoal", "params": {"read_ahead": false, "memory_fraction": 0.25},
                           "runs": [run("warm", 0.0, 0.0, 100.0), run("cold", 2048.0, 4096.0, 200.0), run("cgroup", 2048.0, 4096.0, 250.0)],
                           "skipped": []});
        let hannoy = json!({"lib": "hannoy", "params": {"read_ahead": true},
                            "runs": [run("cold", 8192.0, 8192.0, 900.0)],
                            "skipped": [{"mode": "cgroup", "reason": "no cgroups"}]});
        let t = table(&[shoal, hannoy], "hannoy");
        assert!(t.contains("shoal ra off cold"), "{t}");
        assert!(t.contains("2.0 (0.25x)"), "{t}");
        assert!(t.contains("4.0 (0.50x)"), "{t}");
        assert!(t.contains("250 / 100 ms = 2.50x"), "{t}");
        assert!(t.contains("hannoy ra on: skipped cgroup: no cgroups"), "{t}");
    }

    #[test]
    fn on_slowfs_the_bytes_that_reached_it_are_used() {
        let mut r = run("cold", 0.0, 0.0, 100.0);
        r["insert"]["slowfs_read_bytes"] = json!(10240.0 * 1000.0);
        r["insert"]["slowfs_reads"] = json!(2500);
        let shoal = json!({"lib": "shoal", "params": {"read_ahead": false, "inserts": 1000, "queries": 100}, "runs": [r]});
        let t = table(&[shoal], "hannoy");
        assert!(t.contains("shoal ra off cold slowfs"), "{t}");
        assert!(t.contains("10.0 "), "{t}");
    }
}
