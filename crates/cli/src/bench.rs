//! `blobhouse bench …`: benchmarks that print tables and write plots.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Subcommand;

use blobhouse_bench::calibrate::{CalibrateOptions, calibrate};
use blobhouse_testbed::{Lifetime, Profile, Testbed, default_dir};

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Measure a testbed profile: latency per request size, throughput against requests in flight, fitted model.
    #[command(after_help = "Writes report.txt, latency.csv, throughput.csv, latency.png and throughput.png to --out.\nUses the running testbed (re-shaped to the profile) or starts one for the run.\n\nExamples:\n  blobhouse bench calibrate --profile s3\n  blobhouse bench calibrate --profile s3-scaled --window-secs 10\n  blobhouse bench calibrate --profile lan --samples 100 --concurrency 1,4,16,64")]
    Calibrate {
        /// Testbed profile: lan, s3, s3-scaled, throttled.
        #[arg(long, default_value = "s3")]
        profile: String,
        /// Sequential samples per request size (1 KiB, 1 MiB, 4 MiB, 16 MiB).
        #[arg(long, default_value_t = 40)]
        samples: usize,
        /// Requests in flight for the throughput sweep.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64,128,256,512")]
        concurrency: Vec<usize>,
        /// Seconds measured per concurrency level (after 2 s of warm-up).
        #[arg(long, default_value_t = 4.0)]
        window_secs: f64,
        /// Output directory (default bench-results/calibrate-<profile>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Testbed state directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

pub async fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Calibrate { profile, samples, concurrency, window_secs, out, dir } => {
            anyhow::ensure!(samples > 0, "--samples must be at least 1");
            anyhow::ensure!(concurrency.iter().all(|&c| c > 0), "--concurrency levels must be at least 1");
            anyhow::ensure!(window_secs > 0.0, "--window-secs must be positive");
            let profile = Profile::parse(&profile)?;
            let dir = dir.unwrap_or_else(default_dir);
            // Reuse a running testbed (and leave it running); otherwise start
            // one for this run only.
            let owned = Testbed::status(&dir)?.is_none();
            let lifetime = if owned { Lifetime::TiedToThisProcess } else { Lifetime::Detached };
            let tb = Testbed::up(&dir, profile, lifetime).with_context(|| format!("testbed up in {}", dir.display()))?;
            let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/calibrate-{}", profile.name())));
            let opts = CalibrateOptions { samples, concurrency, window: Duration::from_secs_f64(window_secs), out: out.clone() };
            let result = calibrate(&tb, &opts, &|step| eprintln!("calibrate: {step}")).await;
            if owned {
                Testbed::down(&dir)?;
            }
            let cal = result.map_err(anyhow::Error::msg)?;
            println!("{}", cal.report());
            println!("wrote {}/{{report.txt,latency.csv,throughput.csv,latency.png,throughput.png}}", out.display());
        }
    }
    Ok(())
}
