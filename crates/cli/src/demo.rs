//! `blobhouse demo`: the embedded default. TPC-H in a local directory, the 22
//! queries, every answer checked against reference answers from outside the project.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;

use blobhouse_bench::answers::{REFERENCE_SCALE_FACTORS, Verdict};
use blobhouse_bench::tpch::{self, TABLES};
use blobhouse_engine::{EngineOptions, Session};
use blobhouse_storage::StoreOptions;

#[derive(Args)]
pub struct DemoArgs {
    /// TPC-H scale factor. Reference answers exist for 0.01, 0.1, 1 and 10.
    #[arg(long, default_value_t = 1.0)]
    sf: f64,
    /// Directory that holds the demo databases (one per scale factor).
    #[arg(long, default_value = "blobhouse-demo")]
    dir: PathBuf,
    /// Delete and reload the data instead of reusing an earlier load.
    #[arg(long)]
    fresh: bool,
    /// Run only these queries, e.g. "1,6,19".
    #[arg(long, value_delimiter = ',')]
    queries: Vec<usize>,
    #[command(flatten)]
    engine: crate::EngineArgs,
}

pub async fn run(args: DemoArgs) -> Result<ExitCode> {
    let path = args.dir.join(format!("sf{}", args.sf));
    if args.fresh && path.exists() {
        std::fs::remove_dir_all(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    }
    let url = path.to_string_lossy().to_string();
    let mut options = EngineOptions::default();
    args.engine.apply(&mut options)?;
    let engine = Session::open(&url, &StoreOptions::default(), options).await.with_context(|| format!("cannot open {url}"))?;
    let current = engine.engine().database().refresh().await?;
    let present = TABLES.iter().filter(|t| current.tables.contains_key(**t)).count();
    if present == TABLES.len() {
        println!("Reusing TPC-H SF {} loaded earlier in {} (--fresh reloads it).", args.sf, path.display());
    } else if present > 0 {
        bail!("{} holds some TPC-H tables but not all eight; run with --fresh to reload", path.display());
    } else {
        println!("Generating TPC-H SF {} and loading it into {} …", args.sf, engine.engine().database().location().url);
        let (multi, progress) = crate::load_progress();
        let started = std::time::Instant::now();
        let loads = tpch::load(&engine, args.sf, progress).await.context("TPC-H load failed")?;
        drop(multi);
        let bytes: u64 = loads.iter().map(|l| l.bytes).sum();
        println!("Loaded {} rows ({:.1} MiB of Parquet) in {:.1} s.", loads.iter().map(|l| l.rows).sum::<u64>(), bytes as f64 / 1048576.0, started.elapsed().as_secs_f64());
    }
    print_chunk_sizes(&engine).await?;

    let queries: Vec<usize> = if args.queries.is_empty() { (1..=22).collect() } else { args.queries.clone() };
    if let Some(q) = queries.iter().find(|q| !(1..=22).contains(*q)) {
        bail!("TPC-H has queries 1 to 22, not {q}");
    }
    println!();
    println!("{:>5} {:>10} {:>7} {:>6} {:>12} {:>9}", "query", "time (s)", "rows", "GETs", "MiB fetched", "answer");
    let (mut verified, mut wrong, mut total_time) = (0, 0, 0.0);
    for &q in &queries {
        match tpch::run_query(&engine, q, args.sf).await {
            Ok(run) => {
                let r = &run.result;
                total_time += r.elapsed.as_secs_f64();
                println!(
                    "{:>5} {:>10.3} {:>7} {:>6} {:>12.1} {:>9}",
                    format!("Q{q:02}"),
                    r.elapsed.as_secs_f64(),
                    r.rows(),
                    r.scan.get_requests,
                    r.scan.bytes_fetched as f64 / 1048576.0,
                    run.verdict.label()
                );
                match &run.verdict {
                    Verdict::Verified => verified += 1,
                    Verdict::Mismatch(why) => {
                        wrong += 1;
                        println!("      Q{q:02} differs from the reference answer: {why}");
                    }
                    Verdict::NoReference => {}
                }
            }
            Err(e) => {
                wrong += 1;
                println!("{:>5} failed: {e}", format!("Q{q:02}"));
            }
        }
    }
    println!("{:>5} {:>10.3}", "total", total_time);
    println!();
    let has_reference = REFERENCE_SCALE_FACTORS.iter().any(|s| (s - args.sf).abs() < 1e-9);
    if has_reference {
        println!("{verified} of {} answers verified against reference answers (DuckDB on the same generated data) for SF {}.", queries.len(), args.sf);
    } else {
        println!("No reference answers exist for SF {} (they do for 0.01, 0.1 and 1): answers were not checked.", args.sf);
    }
    Ok(if wrong == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Prints the distribution of lineitem's column-chunk sizes.
async fn print_chunk_sizes(engine: &Session) -> Result<()> {
    let current = engine.engine().database().current();
    let Some(entry) = current.tables.get("lineitem") else { return Ok(()) };
    let manifest = engine.engine().database().manifest(entry).await?;
    let mut sizes: Vec<u64> = manifest.objects.iter().flat_map(|o| o.row_groups.iter().flat_map(|rg| rg.columns.iter().map(|c| c.length))).collect();
    if sizes.is_empty() {
        return Ok(());
    }
    sizes.sort_unstable();
    let mib = |b: u64| b as f64 / 1048576.0;
    let pct = |p: f64| sizes[((sizes.len() - 1) as f64 * p).round() as usize];
    let row_groups: usize = manifest.objects.iter().map(|o| o.row_groups.len()).sum();
    println!(
        "lineitem: {} objects, {row_groups} row groups, {} column chunks; chunk MiB min {:.2} p25 {:.2} median {:.2} p75 {:.2} max {:.2}",
        manifest.objects.len(),
        sizes.len(),
        mib(sizes[0]),
        mib(pct(0.25)),
        mib(pct(0.5)),
        mib(pct(0.75)),
        mib(*sizes.last().expect("non-empty"))
    );
    Ok(())
}
