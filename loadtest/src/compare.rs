//! `compare`: index-bench results (ours and the peers') side by side.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde_json::Value;

/// Flags of `compare`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// JSON files written by `index-bench` or the peers' benchmarks.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The run the ratios are taken against (its "lib" name).
    #[arg(long, default_value = "hnswlib")]
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

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// Renders the comparison; ratios are against the run named `against`.
pub(crate) fn table(runs: &[Value], against: &str) -> String {
    let name = |r: &Value| r["lib"].as_str().unwrap_or("?").to_string();
    let base = runs.iter().find(|r| name(r) == against);
    let ratio = |x: Option<f64>, b: Option<f64>| match (x, b) {
        (Some(x), Some(b)) if b > 0.0 => format!(" ({:.2}x)", x / b),
        _ => String::new(),
    };
    let mut out = String::new();
    let mut row = |cells: Vec<String>| {
        out += &cells.iter().map(|c| format!("{c:<26}")).collect::<String>();
        out.push('\n');
    };
    let mut header = vec!["".to_string()];
    header.extend(runs.iter().map(name));
    row(header);

    let build = |r: &Value, k: &str| f(&r["build"][k]);
    let mut cells = vec!["build vectors/s".to_string()];
    for r in runs {
        let v = build(r, "vectors_per_s");
        cells.push(format!("{:.0}{}", v.unwrap_or(f64::NAN), ratio(v, base.and_then(|b| build(b, "vectors_per_s")))));
    }
    row(cells);
    let mut cells = vec!["disk / raw vectors".to_string()];
    for r in runs {
        let (d, raw) = (build(r, "disk_bytes"), build(r, "raw_bytes"));
        cells.push(match (d, raw) {
            (Some(d), Some(raw)) if raw > 0.0 => format!("{:.2}x ({:.0} MiB)", d / raw, d / 1048576.0),
            _ => "-".into(),
        });
    }
    row(cells);
    let mut cells = vec!["memory (MiB)".to_string()];
    for r in runs {
        let m = build(r, "peak_rss_anon_bytes")
            .map(|m| format!("{:.0} peak RssAnon", m / 1048576.0))
            .or_else(|| build(r, "rss_anon_bytes_after_build").map(|m| format!("{:.0} RssAnon at end", m / 1048576.0)))
            .or_else(|| build(r, "peak_rss_bytes").map(|m| format!("{:.0} VmHWM", m / 1048576.0)));
        cells.push(m.unwrap_or_else(|| "-".into()));
    }
    row(cells);

    let efs: Vec<u64> =
        runs.first().and_then(|r| r["search"].as_array()).map(|a| a.iter().filter_map(|s| s["ef"].as_u64()).collect()).unwrap_or_default();
    let search = |r: &Value, ef: u64| -> Option<(f64, f64)> {
        let s = r["search"].as_array()?.iter().find(|s| s["ef"].as_u64() == Some(ef))?;
        Some((f(&s["recall"])?, f(&s["qps"])?))
    };
    for ef in efs {
        let mut cells = vec![format!("ef={ef} recall / qps")];
        let b = base.and_then(|b| search(b, ef));
        for r in runs {
            cells.push(match search(r, ef) {
                Some((rec, qps)) => format!("{rec:.4} / {qps:.0}{}", ratio(Some(qps), b.map(|b| b.1))),
                None => "-".into(),
            });
        }
        row(cells);
    }
    let inc = |r: &Value, n: u64| -> Option<f64> {
        r["incremental"].as_array()?.iter().find(|s| s["base"].as_u64() == Some(n)).and_then(|s| f(&s["ms_per_vector"]))
    };
    for n in [10_000u64, 30_000, 100_000] {
        let mut cells = vec![format!("1k into {}k ms/vector", n / 1000)];
        for r in runs {
            cells.push(inc(r, n).map_or("-".into(), |v| format!("{v:.4}")));
        }
        row(cells);
    }
    let mut cells = vec!["100k / 10k insert cost".to_string()];
    for r in runs {
        cells.push(match (inc(r, 100_000), inc(r, 10_000)) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        });
    }
    row(cells);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::table;

    #[test]
    fn ratios_are_against_the_named_run() {
        let a = json!({"lib": "shoal", "build": {"vectors_per_s": 50.0, "disk_bytes": 300.0, "raw_bytes": 200.0},
                       "search": [{"ef": 64, "recall": 0.95, "qps": 2000.0}],
                       "incremental": [{"base": 10000, "ms_per_vector": 0.1}, {"base": 100000, "ms_per_vector": 0.15}]});
        let b = json!({"lib": "hnswlib", "build": {"vectors_per_s": 100.0},
                       "search": [{"ef": 64, "recall": 0.95, "qps": 4000.0}], "incremental": []});
        let t = table(&[a, b], "hnswlib");
        assert!(t.contains("50 (0.50x)"), "{t}");
        assert!(t.contains("0.9500 / 2000 (0.50x)"), "{t}");
        assert!(t.contains("1.50x (0 MiB)"), "{t}");
        assert!(t.contains("1.50x\n") || t.contains("1.50x "), "{t}");
    }
}
