//! `blobhouse testbed`: bring the object-store testbed up and down.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;

use blobhouse_testbed::{Lifetime, Profile, Testbed, default_dir};

#[derive(Subcommand)]
pub enum TestbedCommand {
    /// Start MinIO, nginx and toxiproxy (or re-shape a running testbed) with a profile.
    #[command(after_help = "Profiles:\n  lan        no shaping\n  s3         ~30 ms first byte, ~60 MiB/s per connection, a few % stalled/lost/reset/truncated\n  s3-scaled  s3's shape at ~2.5 MiB/s per connection: hundreds of requests fill this machine\n  throttled  nginx answers requests beyond 200/s with HTTP 503\n\nExamples:\n  blobhouse testbed up s3\n  eval \"$(blobhouse testbed env)\" && blobhouse sql --db s3://testbed/db -c 'SHOW TABLES'\n  blobhouse testbed down")]
    Up {
        /// lan, s3, s3-scaled or throttled.
        #[arg(default_value = "lan")]
        profile: String,
        /// State directory (default: $BLOBHOUSE_TESTBED_DIR or /tmp/blobhouse-testbed).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Stop every testbed process and delete its files.
    Down {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Show whether the testbed runs, its profile and endpoints.
    Status {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print `export AWS_…` lines that point S3 clients at the testbed.
    Env {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

pub fn run(cmd: TestbedCommand) -> Result<()> {
    match cmd {
        TestbedCommand::Up { profile, dir } => {
            let dir = dir.unwrap_or_else(default_dir);
            let profile = Profile::parse(&profile)?;
            let tb = Testbed::up(&dir, profile, Lifetime::Detached).with_context(|| format!("testbed up in {}", dir.display()))?;
            describe(&tb);
        }
        TestbedCommand::Down { dir } => {
            let dir = dir.unwrap_or_else(default_dir);
            let stopped = Testbed::down(&dir)?;
            if stopped.is_empty() {
                println!("testbed: nothing was running in {}", dir.display());
            } else {
                println!("testbed: stopped {} processes ({:?}); removed {}", stopped.len(), stopped, dir.display());
            }
        }
        TestbedCommand::Status { dir } => {
            let dir = dir.unwrap_or_else(default_dir);
            match Testbed::status(&dir)? {
                Some(tb) => describe(&tb),
                None => println!("testbed: not running in {} (blobhouse testbed up PROFILE starts it)", dir.display()),
            }
        }
        TestbedCommand::Env { dir } => {
            let dir = dir.unwrap_or_else(default_dir);
            let tb = Testbed::status(&dir)?.context("the testbed is not running; start it with: blobhouse testbed up PROFILE")?;
            for (k, v) in tb.env() {
                println!("export {k}={v}");
            }
        }
    }
    Ok(())
}

fn describe(tb: &Testbed) {
    let p = tb.profile();
    let e = tb.endpoints();
    println!("testbed: profile {} — {}", p.name(), p.description());
    println!("  S3 endpoint   {}   (bucket '{}', unshaped: {})", e.s3, blobhouse_testbed::BUCKET, e.s3_direct);
    println!("  HTTP endpoint {}   (range reads of {}/cal/*, unshaped: {})", e.http, e.http, e.http_direct);
    println!("  credentials   {} / {}   region {}", blobhouse_testbed::ACCESS_KEY, blobhouse_testbed::SECRET_KEY, blobhouse_testbed::REGION);
    println!("  processes     {:?}   state in {}", tb.state().pids, tb.dir().display());
    println!("  use:          eval \"$(blobhouse testbed env)\"; blobhouse testbed down stops everything");
}
