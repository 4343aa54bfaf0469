//! [`Env`]: what one statement of a family module runs with — the engine,
//! a DataFusion context whose tables are seen through the statement's
//! [`Scope`], and when it started. The dispatcher builds it; the family
//! modules (query, dml, ddl, copy, history, optimize) only read it.

use std::time::Instant;

use datafusion::execution::context::SessionContext;

use crate::engine::Engine;
use crate::provider::Scope;

pub(crate) struct Env<'a> {
    pub engine: &'a Engine,
    /// The statement's context: the session's settings, the tables of
    /// `scope`, the past versions it reads.
    pub ctx: SessionContext,
    pub scope: Scope,
    pub started: Instant,
    /// Whether the statement runs inside BEGIN … COMMIT.
    pub in_transaction: bool,
}
