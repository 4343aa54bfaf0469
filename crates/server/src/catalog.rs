//! PostgreSQL's system catalog over blobhouse's tables, for clients that
//! introspect: psql's `\d`, `\dt`, `\l`, `\du`, SQLAlchemy's inspector,
//! JDBC's `DatabaseMetaData`.
//!
//! These clients do not ask for tables the SQL way; they query
//! `pg_catalog.pg_class`, `pg_attribute`, `pg_namespace` … with PostgreSQL's
//! own functions and dialect (`OPERATOR(pg_catalog.~)`, `'t'::regclass`,
//! `= ANY(ARRAY[…])`). datafusion-pg-catalog provides those tables (built
//! from the DataFusion catalog the engine's statements see), the functions
//! and a rewriter for the dialect; this module installs them on the engine's
//! base context and decides which statements go through the rewriter —
//! only introspection, so that blobhouse's own syntax (time travel, COPY,
//! OPTIMIZE, snapshots) never meets a rewriter that does not know it.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion_pg_catalog::pg_catalog::context::{PgCatalogContextProvider, Role};
use datafusion_pg_catalog::sql::PostgresCompatibilityParser;

use blobhouse_engine::Engine;

use crate::ServerError;
use crate::auth::Users;

/// The users of the server, as `pg_roles` lists them (`\du`).
#[derive(Debug, Clone)]
struct Roles(Arc<Users>);

#[async_trait]
impl PgCatalogContextProvider for Roles {
    async fn roles(&self) -> Vec<String> {
        self.0.names()
    }

    async fn role(&self, name: &str) -> Option<Role> {
        self.0.names().into_iter().find(|n| n == name).map(|name| Role {
            name,
            // Every user may read and change every table: there are no
            // grants yet, so each is shown as what it is, a superuser.
            is_superuser: true,
            can_login: true,
            can_create_db: false,
            can_create_role: false,
            can_create_user: false,
            can_replication: false,
            grants: Vec::new(),
            inherited_roles: Vec::new(),
        })
    }
}

/// Installs `pg_catalog` and PostgreSQL's catalog functions on `engine`'s
/// base context; sessions opened afterwards see them.
pub(crate) fn install(engine: &Engine, users: Arc<Users>) -> Result<(), ServerError> {
    let ctx = engine.session();
    let catalog = ctx.state().config().options().catalog.default_catalog.clone();
    datafusion_pg_catalog::pg_catalog::setup_pg_catalog(ctx, &catalog, Roles(users)).map_err(|e| ServerError::Catalog(e.to_string()))
}

/// Rewrites an introspection query into SQL the engine runs.
pub(crate) struct Introspection {
    parser: PostgresCompatibilityParser,
}

impl Introspection {
    pub(crate) fn new() -> Introspection {
        Introspection { parser: PostgresCompatibilityParser::new() }
    }

    /// `sql` in the form DataFusion plans, when it asks PostgreSQL's
    /// catalog (or its functions); any other statement unchanged.
    pub(crate) fn rewrite<'a>(&self, sql: &'a str) -> Cow<'a, str> {
        if !asks_the_catalog(sql) {
            return Cow::Borrowed(sql);
        }
        match self.parser.parse(sql) {
            Ok(statements) if statements.len() == 1 => Cow::Owned(statements[0].to_string()),
            // What the rewriter cannot parse goes to the engine as it is,
            // whose error then names the problem.
            _ => Cow::Borrowed(sql),
        }
    }
}

/// Whether `sql` reads PostgreSQL's catalog or calls what only it has.
fn asks_the_catalog(sql: &str) -> bool {
    let lower = sql.to_ascii_lowercase();
    ["pg_", "information_schema", "::reg", "current_schema", "current_database", "version()", "current_user", "session_user"]
        .iter()
        .any(|word| lower.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_introspection_is_rewritten() {
        let i = Introspection::new();
        // blobhouse's own syntax never meets the rewriter.
        for sql in ["SELECT * FROM t AS OF VERSION 3", "COPY t FROM 'x.csv'", "OPTIMIZE t", "SELECT 'a''b' AS x"] {
            assert!(matches!(i.rewrite(sql), Cow::Borrowed(s) if s == sql), "{sql}");
        }
        // psql's `\d t` asks with an operator DataFusion does not parse.
        let psql = "SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname OPERATOR(pg_catalog.~) '^(t)$' COLLATE pg_catalog.default";
        let rewritten = i.rewrite(psql);
        assert!(!rewritten.contains("OPERATOR") && !rewritten.contains("COLLATE"), "{rewritten}");
        assert!(rewritten.contains("pg_catalog.pg_class"), "{rewritten}");
    }
}
