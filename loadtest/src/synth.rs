//! `synth`: writes a synthetic .fvecs file (clustered Gaussian vectors), for
//! measurements that need more vectors than the real dataset has, such as
//! the builder's memory on indexes of a million points.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Flags of `synth`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Vectors to write.
    #[arg(long)]
    n: usize,
    /// Components per vector.
    #[arg(long, default_value_t = 64)]
    dim: usize,
    /// Cluster centres the vectors scatter around.
    #[arg(long, default_value_t = 1000)]
    clusters: usize,
    /// Noise around a centre, relative to the centres' spread.
    #[arg(long, default_value_t = 0.3)]
    spread: f32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output file (.fvecs).
    #[arg(long)]
    out: PathBuf,
}

pub(crate) fn run(a: Args) -> Result<()> {
    if a.n == 0 || a.dim == 0 || a.clusters == 0 {
        bail!("--n, --dim and --clusters must be at least 1");
    }
    let mut rng = StdRng::seed_from_u64(a.seed);
    let mut gauss = move || -> f32 {
        // Box–Muller; the second value is dropped for simplicity.
        let (u, v): (f32, f32) = (rng.random_range(f32::EPSILON..1.0), rng.random());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    };
    let centres: Vec<Vec<f32>> = (0..a.clusters).map(|_| (0..a.dim).map(|_| gauss()).collect()).collect();
    let file = std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let mut pick = StdRng::seed_from_u64(a.seed ^ 0x5eed);
    for _ in 0..a.n {
        let c = &centres[pick.random_range(0..a.clusters)];
        out.write_all(&(a.dim as i32).to_le_bytes())?;
        for &x in c {
            out.write_all(&(x + a.spread * gauss()).to_le_bytes())?;
        }
    }
    out.flush().with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!("wrote {} vectors of {} dimensions to {}", a.n, a.dim, a.out.display());
    Ok(())
}
