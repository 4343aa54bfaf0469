//! Time travel in statements: a table read as of a past version.
//!
//! One syntax family, Snowflake's `AT(…)` clause with blobhouse's keys, and
//! Databricks' two short forms:
//!
//! ```sql
//! SELECT … FROM t AT(VERSION => 42)
//! SELECT … FROM t AT(TIMESTAMP => '2026-11-23 05:00:00')   -- UTC; the version current then
//! SELECT … FROM t AT(SNAPSHOT => 'nightly')
//! SELECT … FROM t VERSION AS OF 42
//! SELECT … FROM t TIMESTAMP AS OF '2026-11-23 05:00:00'
//! ```
//!
//! The parser ([`crate::parser`]) reads these as a table reference's
//! version clause, anywhere a table may stand: joins, subqueries, CTEs,
//! the WHERE of a DELETE or UPDATE, `INSERT … SELECT`, `COPY (…) TO`.
//! DataFusion's planner has no table versions, so each versioned reference
//! `t AT(VERSION => 42)` becomes `blobhouse_at_v42.t AS t`: a read-only
//! schema of the statement's own catalog that holds version 42's tables
//! (the session resolves it), under the alias the statement would have
//! had without the clause — so result columns are named as the user
//! wrote them (`sum(t.x)`), and the schema never shows.
//!
//! Inside a transaction, a past version is read as committed, never with
//! the transaction's own changes — also when it is the version the
//! transaction started from.

use datafusion::sql::sqlparser::ast::{Expr, FunctionArg, FunctionArgExpr, FunctionArguments, TableVersion, Value};

/// Prefix of the schemas that hold past versions.
pub(crate) const AT_SCHEMA_PREFIX: &str = "blobhouse_at_";

/// Which past version a table is read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AsOf {
    Version(u64),
    /// Milliseconds since the epoch (UTC).
    Timestamp(u64),
    Snapshot(String),
}

impl AsOf {
    /// The schema a table read at this point is placed in.
    pub(crate) fn schema(&self) -> String {
        match self {
            AsOf::Version(v) => format!("{AT_SCHEMA_PREFIX}v{v}"),
            AsOf::Timestamp(ms) => format!("{AT_SCHEMA_PREFIX}ts{ms}"),
            AsOf::Snapshot(name) => format!("{AT_SCHEMA_PREFIX}snapshot_{name}"),
        }
    }
}

/// What a time-travel clause must look like, for errors.
pub(crate) const FORMS: &str = "write t AT(VERSION => n), t AT(TIMESTAMP => '2026-01-31 12:00:00'), t AT(SNAPSHOT => 'name'), t VERSION AS OF n or t TIMESTAMP AS OF '…'";

/// The point in time a version clause names.
pub(crate) fn as_of(version: &TableVersion) -> Result<AsOf, String> {
    let bad = |what: String| format!("time travel: {what}; {FORMS}");
    match version {
        TableVersion::VersionAsOf(e) => Ok(AsOf::Version(number(e).map_err(bad)?)),
        TableVersion::TimestampAsOf(e) | TableVersion::ForSystemTimeAsOf(e) => Ok(AsOf::Timestamp(timestamp(e).map_err(bad)?)),
        TableVersion::Function(Expr::Function(f)) if f.name.to_string().eq_ignore_ascii_case("at") => {
            let FunctionArguments::List(list) = &f.args else { return Err(bad("AT needs (KIND => value)".into())) };
            let [arg] = list.args.as_slice() else { return Err(bad("AT takes one KIND => value".into())) };
            let (kind, value) = match arg {
                FunctionArg::Named { name, arg: FunctionArgExpr::Expr(value), .. } => (name.value.clone(), value),
                FunctionArg::ExprNamed { name: Expr::Identifier(name), arg: FunctionArgExpr::Expr(value), .. } => (name.value.clone(), value),
                other => return Err(bad(format!("AT({other})"))),
            };
            match kind.to_ascii_uppercase().as_str() {
                "VERSION" => Ok(AsOf::Version(number(value).map_err(bad)?)),
                "TIMESTAMP" => Ok(AsOf::Timestamp(timestamp(value).map_err(bad)?)),
                "SNAPSHOT" => Ok(AsOf::Snapshot(snapshot(value).map_err(bad)?)),
                _ => Err(bad(format!("AT({kind} => …): use VERSION, TIMESTAMP or SNAPSHOT"))),
            }
        }
        other => Err(bad(format!("'{other}' is not supported"))),
    }
}

fn number(e: &Expr) -> Result<u64, String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().map_err(|_| format!("'{n}' is not a version number")),
            other => Err(format!("'{other}' is not a version number")),
        },
        other => Err(format!("'{other}' is not a version number")),
    }
}

fn timestamp(e: &Expr) -> Result<u64, String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => parse_timestamp_ms(s),
            other => Err(format!("'{other}' is not a quoted timestamp")),
        },
        other => Err(format!("'{other}' is not a quoted timestamp")),
    }
}

fn snapshot(e: &Expr) -> Result<String, String> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) => Ok(s.clone()),
            other => Err(format!("'{other}' is not a snapshot name")),
        },
        Expr::Identifier(id) => Ok(id.value.clone()),
        other => Err(format!("'{other}' is not a snapshot name")),
    }
}

/// `'2026-11-23 05:00:00'` (UTC unless it says otherwise) as milliseconds
/// since the epoch.
pub(crate) fn parse_timestamp_ms(s: &str) -> Result<u64, String> {
    let nanos = datafusion::arrow::compute::kernels::cast_utils::string_to_timestamp_nanos(s).map_err(|e| format!("'{s}' is not a timestamp ({e})"))?;
    u64::try_from(nanos / 1_000_000).map_err(|_| format!("'{s}' is before 1970"))
}
