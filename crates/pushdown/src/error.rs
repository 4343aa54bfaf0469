//! What can go wrong between a compute process and a storage node.
//!
//! The variants say what the caller should do: a refused or unreachable
//! node means "fetch the data yourself" (the answer stays right, only the
//! plan changes); a rejected request is a bug or a misconfiguration on the
//! caller's side (wrong token, a fragment the node does not run) and is
//! reported; a failed task names the object that failed.

use datafusion::error::DataFusionError;

/// An error of the pushdown client or of the storage node.
#[derive(Debug, thiserror::Error)]
pub enum PushdownError {
    /// The node's CPU budget is full: fetch instead (adaptive pushdown).
    #[error("storage node {endpoint} refused the work: {reason}")]
    Refused { endpoint: String, reason: String },
    /// The node cannot be reached or went away mid-task.
    #[error("storage node {endpoint} is unavailable: {reason}")]
    Unavailable { endpoint: String, reason: String },
    /// The node rejected the request: wrong token, or a fragment it does not
    /// run (see docs/pushdown.md, "What a node runs").
    #[error("storage node {endpoint} rejected the request: {reason}")]
    Rejected { endpoint: String, reason: String },
    /// The node accepted the task and it failed there (e.g. a data object
    /// is missing or damaged).
    #[error("storage node {endpoint} failed the task: {reason}")]
    Failed { endpoint: String, reason: String },
    /// The endpoint is not a valid URL.
    #[error("storage node endpoint {endpoint:?} is not valid: {reason} (expected e.g. http://127.0.0.1:50061)")]
    BadEndpoint { endpoint: String, reason: String },
    /// A fragment could not be encoded (the caller built something a node
    /// cannot run).
    #[error("cannot ship this plan fragment to a storage node: {0}")]
    Encode(#[source] DataFusionError),
}

impl PushdownError {
    /// Whether fetching the data instead gives the right answer: true for a
    /// busy, unreachable or failing node; a rejected request is reported
    /// rather than hidden, since every later request would be rejected too.
    pub fn fetch_instead(&self) -> bool {
        matches!(self, PushdownError::Refused { .. } | PushdownError::Unavailable { .. } | PushdownError::Failed { .. })
    }

    /// Classifies a gRPC status from `endpoint`.
    pub(crate) fn from_status(endpoint: &str, status: &tonic::Status) -> PushdownError {
        use tonic::Code;
        let endpoint = endpoint.to_string();
        let reason = status.message().to_string();
        match status.code() {
            Code::ResourceExhausted => PushdownError::Refused { endpoint, reason },
            Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded | Code::Unknown => PushdownError::Unavailable { endpoint, reason },
            Code::Unauthenticated | Code::PermissionDenied | Code::InvalidArgument | Code::Unimplemented | Code::FailedPrecondition => {
                PushdownError::Rejected { endpoint, reason }
            }
            _ => PushdownError::Failed { endpoint, reason },
        }
    }
}
