//! The S3 server of a test process: the project's testbed (`lan` profile) —
//! MinIO, nginx and toxiproxy — started on first use in a directory of its
//! own, tied to the test process (the servers die with it), and with a bucket
//! for the tests.

use std::path::PathBuf;
use std::sync::OnceLock;

use blobhouse_testbed::{Lifetime, Profile, Testbed};

pub use blobhouse_testbed::{ACCESS_KEY, SECRET_KEY, TEST_BUCKET};

/// The running testbed of this test process.
#[derive(Debug)]
pub struct MinioServer {
    /// `http://127.0.0.1:PORT` of MinIO, unshaped.
    pub endpoint: String,
    /// The whole testbed, for tests that shape connections themselves.
    pub testbed: Testbed,
}

static SERVER: OnceLock<Result<MinioServer, String>> = OnceLock::new();

impl MinioServer {
    /// The process-wide server, started on first call. Panics with
    /// instructions when a server is not installed: the S3 tests must not be
    /// silently skipped.
    pub fn shared() -> &'static MinioServer {
        crate::shared(&SERVER, start)
    }

    /// A fresh `s3://` URL under the test bucket.
    pub fn fresh_url(&self, name: &str) -> String {
        format!("s3://{TEST_BUCKET}/{}", crate::unique(name))
    }

    /// AWS_* settings to reach this server from a child process.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = self.testbed.env();
        for (k, v) in env.iter_mut() {
            if *k == "AWS_ENDPOINT_URL" {
                *v = self.endpoint.clone();
            }
        }
        env
    }
}

fn dir_for(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("blobhouse-testbed-test-{pid}"))
}

fn start() -> Result<MinioServer, String> {
    remove_stale_testbeds();
    let testbed = Testbed::up(&dir_for(std::process::id()), Profile::Lan, Lifetime::TiedToThisProcess).map_err(|e| format!("cannot start the testbed: {e}"))?;
    let endpoint = testbed.endpoints().s3_direct;
    Ok(MinioServer { endpoint, testbed })
}

/// Testbeds of test processes that no longer run are taken down, so repeated
/// runs neither leak processes nor fill the disk.
fn remove_stale_testbeds() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix("blobhouse-testbed-test-").and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Testbed::down(&entry.path());
        }
    }
}
