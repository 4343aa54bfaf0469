//! Errors of the testbed, each naming the server or file involved.

/// Result alias of the testbed.
pub type Result<T, E = TestbedError> = std::result::Result<T, E>;

/// What went wrong bringing the testbed up or down.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error("{tool} is not installed ({hint})")]
    MissingTool { tool: &'static str, hint: &'static str },
    #[error("cannot start {what}: {source}")]
    Spawn { what: String, source: std::io::Error },
    #[error("{what} did not become ready within {secs} s; its log ({log}):\n{tail}")]
    NotReady { what: String, secs: u64, log: String, tail: String },
    #[error("toxiproxy API {request} failed: {message}")]
    Toxiproxy { request: String, message: String },
    #[error("testbed state {path}: {message}")]
    State { path: String, message: String },
    #[error("{tool}: {message}")]
    Tool { tool: String, message: String },
    #[error("the testbed runs profile {from}, and {to} places MinIO elsewhere (the bottleneck profile puts it in a network namespace behind a shaped link): run `blobhouse testbed down` first, which deletes the testbed's buckets")]
    TopologyChange { from: &'static str, to: &'static str },
    #[error("unknown profile '{0}'; the profiles are: lan, s3, s3-scaled, throttled, bottleneck")]
    UnknownProfile(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
