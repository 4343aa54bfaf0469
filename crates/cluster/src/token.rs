//! The cluster's token: every call to a worker — from a coordinator, or
//! from another worker reading a shuffle — carries `authorization: Bearer
//! <token>`, and a worker answers nothing else. A worker never starts
//! without one (fail closed, like `serve` and the storage node).
//!
//! Why by hand: the check is a few lines around tonic's interceptor; the
//! client side is a tower service that adds the header to each request,
//! because datafusion-distributed's channel type only takes a plain
//! request/response service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::HeaderValue;
use tonic::body::Body;
use tonic::{Request, Status};

/// The bearer token of a cluster (never shown in Debug output).
#[derive(Clone)]
pub struct ClusterToken {
    secret: Arc<str>,
    header: HeaderValue,
}

/// A token that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the cluster token is not set: export {0}=<token> on the workers and the coordinator (the same value)")]
    Unset(String),
    #[error("the cluster token cannot be sent as an HTTP header (use letters, digits and punctuation)")]
    NotAHeader,
}

impl fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterToken(<redacted>)")
    }
}

impl ClusterToken {
    /// A token; empty or blank is refused.
    pub fn new(secret: &str) -> Result<ClusterToken, TokenError> {
        if secret.trim().is_empty() {
            return Err(TokenError::Unset("BLOBHOUSE_CLUSTER_TOKEN".into()));
        }
        let mut header = HeaderValue::from_str(&format!("Bearer {secret}")).map_err(|_| TokenError::NotAHeader)?;
        header.set_sensitive(true);
        Ok(ClusterToken { secret: secret.into(), header })
    }

    /// The token in the environment variable `var`.
    pub fn from_env(var: &str) -> Result<ClusterToken, TokenError> {
        match std::env::var(var) {
            Ok(t) if !t.trim().is_empty() => ClusterToken::new(&t),
            _ => Err(TokenError::Unset(var.into())),
        }
    }

    /// Whether a request carries this token (compared in constant time).
    pub fn check<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let given = request.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        match given {
            Some(t) if constant_time_eq(t.as_bytes(), self.secret.as_bytes()) => Ok(()),
            _ => Err(Status::unauthenticated("blobhouse worker: missing or wrong cluster token (give the coordinator the workers' BLOBHOUSE_CLUSTER_TOKEN)")),
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A client service that adds the token to every request.
#[derive(Clone)]
pub(crate) struct WithToken<S> {
    pub(crate) inner: S,
    pub(crate) token: ClusterToken,
}

impl<S> tower::Service<http::Request<Body>> for WithToken<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        request.headers_mut().insert(http::header::AUTHORIZATION, self.token.header.clone());
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_checked_whole_and_never_shown() {
        let t = ClusterToken::new("s3cr3t").unwrap();
        assert!(!format!("{t:?}").contains("s3cr3t"));
        let with = |h: &str| {
            let mut r = Request::new(());
            r.metadata_mut().insert("authorization", h.parse().unwrap());
            r
        };
        assert!(t.check(&with("Bearer s3cr3t")).is_ok());
        for bad in ["Bearer s3cr3", "Bearer s3cr3tt", "s3cr3t", "Bearer "] {
            assert!(t.check(&with(bad)).is_err(), "{bad}");
        }
        assert!(t.check(&Request::new(())).is_err());
        assert!(ClusterToken::new("  ").is_err());
        assert!(ClusterToken::new("a\nb").is_err());
    }
}
