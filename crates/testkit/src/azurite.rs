//! Azure Blob Storage for a test process: Azurite (Microsoft's emulator,
//! installed pinned by `scripts/install-test-deps.sh`), started on first use
//! on a free port of 127.0.0.1, tied to the process (it dies with it), with
//! a container for the tests.
//!
//! blobhouse reaches it the way it reaches a real account: `az://` URLs,
//! the account's name and shared key, and the account endpoint
//! (`StoreOptions::endpoint`) — not object_store's emulator switch, which
//! reads its address from the environment only.

use std::path::PathBuf;
use std::sync::OnceLock;

use blobhouse_testbed::process::{Lifetime, free_port, spawn, wait_ready};

/// Azurite's account (the emulator's well-known one).
pub const ACCOUNT: &str = "devstoreaccount1";
/// Its shared key (published with the emulator; not a secret).
pub const ACCOUNT_KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The container the tests' databases live in.
pub const CONTAINER: &str = "blobhouse-test";

/// The running emulator of this test process.
#[derive(Debug)]
pub struct AzuriteServer {
    /// The account endpoint, `http://127.0.0.1:PORT/devstoreaccount1`.
    pub endpoint: String,
    /// Its working directory (data and log).
    pub dir: PathBuf,
}

static SERVER: OnceLock<Result<AzuriteServer, String>> = OnceLock::new();

impl AzuriteServer {
    /// The process-wide emulator, started on first call. Panics with
    /// instructions when it is not installed: the Azure tests must not be
    /// silently skipped.
    pub fn shared() -> &'static AzuriteServer {
        crate::shared(&SERVER, start)
    }

    /// A fresh `az://` URL in the test container.
    pub fn fresh_url(&self, name: &str) -> String {
        format!("az://{CONTAINER}/{}", crate::unique(name))
    }

    /// The environment that points a child process (`blobhouse …`) at it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_ACCOUNT_NAME", ACCOUNT.into()),
            ("AZURE_STORAGE_ACCOUNT_KEY", ACCOUNT_KEY.into()),
            ("AZURE_STORAGE_ENDPOINT", self.endpoint.clone()),
            ("AZURE_ALLOW_HTTP", "true".into()),
        ]
    }
}

impl AzuriteServer {
    /// A SAS token for the test container (read, add, create, write,
    /// delete, list; two hours), made with Azure's Python client: what a
    /// user given only a container SAS has.
    pub fn container_sas(&self) -> String {
        let script = format!(
            "from azure.storage.blob import generate_container_sas, ContainerSasPermissions\n\
             from datetime import datetime, timedelta, timezone\n\
             print(generate_container_sas('{ACCOUNT}', '{CONTAINER}', account_key='{ACCOUNT_KEY}', permission=ContainerSasPermissions(read=True, add=True, create=True, write=True, delete=True, list=True), expiry=datetime.now(timezone.utc) + timedelta(hours=2)))\n"
        );
        let out = std::process::Command::new("python3").args(["-c", &script]).output().expect("run python3");
        assert!(out.status.success(), "cannot make a SAS token: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("a SAS token is text").trim().to_string()
    }
}

/// The `azurite-blob` executable: `AZURITE_BIN`, the install script's
/// place, or `PATH`.
fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("AZURITE_BIN") {
        return Some(PathBuf::from(p));
    }
    let mut candidates: Vec<PathBuf> = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/blobhouse-tools/azurite/node_modules/.bin/azurite-blob")).into_iter().collect();
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("azurite-blob")));
    }
    candidates.into_iter().find(|p| p.is_file())
}

fn start() -> Result<AzuriteServer, String> {
    launch("test", &[], "http")
}

impl AzuriteServer {
    /// Another emulator, for this caller alone: HTTPS with the certificate
    /// `cert` and its key `key`, and OAuth bearer tokens accepted (Azurite's
    /// `--oauth basic`: a token's issuer, audience and lifetime are
    /// checked, not its signature) — what a managed identity's token is
    /// tested against. Azurite takes OAuth only over HTTPS.
    pub fn start_oauth(cert: &std::path::Path, key: &std::path::Path) -> Result<AzuriteServer, String> {
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        launch(&crate::unique("oauth"), &["--oauth", "basic", "--cert", &cert, "--key", &key], "https")
    }
}

fn launch(name: &str, extra: &[&str], scheme: &str) -> Result<AzuriteServer, String> {
    let bin = binary().ok_or("Azurite is not installed: run scripts/install-test-deps.sh (npm install azurite into ~/.cache/blobhouse-tools/azurite)")?;
    let dir = std::env::temp_dir().join(format!("blobhouse-azurite-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let port = free_port().map_err(|e| e.to_string())?;
    let log = dir.join("azurite.log");
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string(), "--location"]).arg(dir.join("data")).args(["--skipApiVersionCheck", "--silent"]).args(extra);
    spawn("azurite", cmd, &log, Lifetime::TiedToThisProcess).map_err(|e| format!("cannot start Azurite: {e}"))?;
    wait_ready("azurite", &log, 60, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()).map_err(|e| e.to_string())?;
    let endpoint = format!("{scheme}://127.0.0.1:{port}/{ACCOUNT}");
    create_container(&endpoint)?;
    Ok(AzuriteServer { endpoint, dir })
}

/// Creates the test container with Azure's own Python client (object_store
/// has no container API; installed by the test script).
fn create_container(endpoint: &str) -> Result<(), String> {
    let script = format!(
        "from azure.storage.blob import BlobServiceClient\n\
         c = BlobServiceClient.from_connection_string('DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};BlobEndpoint={endpoint};', connection_verify=False)\n\
         c.create_container('{CONTAINER}')\n"
    );
    let out = std::process::Command::new("python3").args(["-c", &script]).output().map_err(|e| format!("cannot run python3 to create the Azurite container: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cannot create the Azurite container {CONTAINER} (is azure-storage-blob installed? run scripts/install-test-deps.sh): {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default()
        ));
    }
    Ok(())
}
