//! PostgreSQL's run-time parameters of one connection: what `SET`,
//! `RESET`, `SHOW` and `current_setting()` read and write.
//!
//! Drivers and ORMs set parameters on connecting (pgjdbc:
//! `extra_float_digits`, `application_name`; SQLAlchemy and JDBC:
//! `SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL …`; psycopg
//! checks `client_encoding` and `DateStyle`), and fail when the server
//! refuses. These parameters belong to the connection, not to the engine,
//! so this module keeps them beside the connection's engine session and
//! answers them itself; blobhouse's own settings (`memory_limit`,
//! `cache_*`, `pushdown`, `datafusion.*`) go on to the engine.
//!
//! Each parameter either changes what blobhouse does (`statement_timeout`
//! stops statements), describes what it does (`transaction_isolation` is
//! snapshot isolation, which PostgreSQL calls repeatable read), or is
//! kept for the client to read back (`application_name`). A value blobhouse
//! cannot honour is refused with an error that says what it does instead —
//! never accepted and silently ignored where it would change answers.

use std::collections::BTreeMap;
use std::time::Duration;

use datafusion::sql::sqlparser::ast::{ContextModifier, Expr, Reset, Set, Statement, TransactionIsolationLevel, TransactionMode, Value};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// A parameter this server knows.
struct Parameter {
    /// As PostgreSQL spells it in `SHOW ALL` (names match without case).
    name: &'static str,
    default: &'static str,
    check: Check,
    /// Sent to the client in a ParameterStatus message when it changes
    /// (PostgreSQL's GUC_REPORT list).
    reported: bool,
    description: &'static str,
}

/// What a parameter accepts.
#[derive(Clone, Copy)]
enum Check {
    /// Any text.
    Any,
    /// Fixed by the server: `SET` is refused.
    ReadOnly,
    /// One of these (compared without case); the value is kept as given
    /// in lower case.
    OneOf(&'static [&'static str]),
    /// Only this value can be honoured; the text says what blobhouse does.
    Only(&'static str, &'static str),
    /// An integer in the range.
    Int(i64, i64),
    /// A duration in milliseconds (PostgreSQL's units: us, ms, s, min, h, d).
    Millis,
    /// `UTF8` and its spellings.
    Encoding,
    /// `ISO` with an optional order (`ISO, MDY`).
    DateStyle,
    /// A list of schemas that exist.
    SearchPath,
    /// An isolation level blobhouse provides (snapshot isolation serves
    /// READ UNCOMMITTED, READ COMMITTED and REPEATABLE READ; SERIALIZABLE
    /// is refused rather than weakened).
    Isolation,
    /// on / off and PostgreSQL's other spellings of a boolean.
    Bool,
}

const ISOLATION: &str = "repeatable read";

/// Every parameter the server answers, in `SHOW ALL`'s order.
const PARAMETERS: &[Parameter] = &[
    Parameter { name: "application_name", default: "", check: Check::Any, reported: true, description: "Sets the application name to be reported in statistics and logs." },
    Parameter { name: "bytea_output", default: "hex", check: Check::Only("hex", "BYTEA values are sent in the hex format"), reported: false, description: "Sets the output format for bytea." },
    Parameter { name: "client_encoding", default: "UTF8", check: Check::Encoding, reported: true, description: "Sets the client's character set encoding." },
    Parameter { name: "client_min_messages", default: "notice", check: Check::OneOf(&["debug5", "debug4", "debug3", "debug2", "debug1", "debug", "log", "notice", "warning", "error"]), reported: false, description: "Sets the message levels that are sent to the client." },
    Parameter { name: "DateStyle", default: "ISO, MDY", check: Check::DateStyle, reported: true, description: "Sets the display format for date and time values." },
    Parameter { name: "default_transaction_isolation", default: ISOLATION, check: Check::Isolation, reported: false, description: "Sets the transaction isolation level of each new transaction." },
    Parameter { name: "default_transaction_read_only", default: "off", check: Check::Only("off", "read-only transactions are not supported; every transaction may write"), reported: true, description: "Sets the default read-only status of new transactions." },
    Parameter { name: "default_table_access_method", default: "heap", check: Check::ReadOnly, reported: false, description: "Sets the default table access method for new tables." },
    Parameter { name: "extra_float_digits", default: "1", check: Check::Int(-15, 3), reported: false, description: "Sets the number of digits displayed for floating-point values (blobhouse always sends the shortest exact form)." },
    Parameter { name: "idle_in_transaction_session_timeout", default: "0", check: Check::Millis, reported: false, description: "Sets the maximum allowed idle time between queries, when in a transaction (accepted, not enforced)." },
    Parameter { name: "integer_datetimes", default: "on", check: Check::ReadOnly, reported: true, description: "Shows whether datetimes are integer based." },
    Parameter { name: "IntervalStyle", default: "postgres", check: Check::Only("postgres", "intervals are shown in the postgres style"), reported: true, description: "Sets the display format for interval values." },
    Parameter { name: "is_superuser", default: "on", check: Check::ReadOnly, reported: true, description: "Shows whether the current user is a superuser." },
    Parameter { name: "jit", default: "off", check: Check::Bool, reported: false, description: "Allow JIT compilation (blobhouse has none)." },
    Parameter { name: "lc_collate", default: "C", check: Check::ReadOnly, reported: false, description: "Shows the collation order locale." },
    Parameter { name: "lc_ctype", default: "C", check: Check::ReadOnly, reported: false, description: "Shows the character classification and case conversion locale." },
    Parameter { name: "lock_timeout", default: "0", check: Check::Millis, reported: false, description: "Sets the maximum allowed duration of any wait for a lock (blobhouse takes no locks)." },
    Parameter { name: "max_identifier_length", default: "63", check: Check::ReadOnly, reported: false, description: "Shows the maximum identifier length." },
    Parameter { name: "max_index_keys", default: "32", check: Check::ReadOnly, reported: false, description: "Shows the maximum number of index keys." },
    Parameter { name: "row_security", default: "on", check: Check::Bool, reported: false, description: "Enable row security." },
    Parameter { name: "search_path", default: "\"$user\", public", check: Check::SearchPath, reported: false, description: "Sets the schema search order for names that are not schema-qualified." },
    Parameter { name: "server_encoding", default: "UTF8", check: Check::ReadOnly, reported: true, description: "Shows the server (database) character set encoding." },
    Parameter { name: "server_version", default: "16.0", check: Check::ReadOnly, reported: true, description: "Shows the server version." },
    Parameter { name: "server_version_num", default: "160000", check: Check::ReadOnly, reported: false, description: "Shows the server version as an integer." },
    Parameter { name: "standard_conforming_strings", default: "on", check: Check::Only("on", "backslashes in ordinary string literals are ordinary characters"), reported: true, description: "Causes '...' strings to treat backslashes literally." },
    Parameter { name: "statement_timeout", default: "0", check: Check::Millis, reported: false, description: "Sets the maximum allowed duration of any statement." },
    Parameter { name: "TimeZone", default: "UTC", check: Check::Any, reported: true, description: "Sets the time zone for displaying and interpreting time stamps (blobhouse computes and shows timestamps in UTC)." },
    Parameter { name: "transaction_isolation", default: ISOLATION, check: Check::Isolation, reported: false, description: "Sets the current transaction's isolation level." },
    Parameter { name: "transaction_read_only", default: "off", check: Check::Only("off", "read-only transactions are not supported; every transaction may write"), reported: false, description: "Sets the current transaction's read-only status." },
];

/// Whether `name` is an engine setting of the engine's registry or one of
/// DataFusion's, which the engine answers.
fn is_engine_setting(name: &str) -> bool {
    name.trim().to_ascii_lowercase().starts_with("datafusion.") || blobhouse_engine::settings::lookup(name).is_some_and(|s| s.scope == blobhouse_engine::settings::Scope::Engine)
}

fn parameter(name: &str) -> Option<&'static Parameter> {
    let name = match name.to_ascii_lowercase().as_str() {
        // PostgreSQL's other names for the same parameters.
        "transaction isolation level" => "transaction_isolation".to_string(),
        "time zone" => "timezone".to_string(),
        "session characteristics" => "default_transaction_isolation".to_string(),
        other => other.to_string(),
    };
    PARAMETERS.iter().find(|p| p.name.eq_ignore_ascii_case(&name))
}

/// A refused `SET`, `SHOW` or `RESET`: PostgreSQL's code and words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SettingError {
    pub(crate) sqlstate: &'static str,
    pub(crate) message: String,
}

fn error(sqlstate: &'static str, message: impl Into<String>) -> SettingError {
    SettingError { sqlstate, message: message.into() }
}

/// What a statement about parameters did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// `SET` / `RESET` done; these reported parameters changed (name, new
    /// value: a ParameterStatus each).
    Changed(Vec<(&'static str, String)>),
    /// `SHOW`: rows of (column name, values).
    Show { column: String, rows: Vec<[String; 3]>, all: bool },
}

/// One connection's parameters.
#[derive(Debug, Clone, Default)]
pub(crate) struct Settings {
    /// Values set in this session (by canonical name), over the defaults.
    set: BTreeMap<&'static str, String>,
    /// Custom parameters (`myapp.tenant`): PostgreSQL keeps any dotted
    /// name a client sets.
    custom: BTreeMap<String, String>,
    /// The user name (`session_authorization`).
    user: String,
}

impl Settings {
    /// The defaults, for `user`.
    pub(crate) fn new(user: &str) -> Settings {
        Settings { user: user.to_string(), ..Settings::default() }
    }

    /// The value of `name`, if it is a parameter.
    pub(crate) fn get(&self, name: &str) -> Option<String> {
        if name.eq_ignore_ascii_case("session_authorization") || name.eq_ignore_ascii_case("current_user") {
            return Some(self.user.clone());
        }
        if let Some(p) = parameter(name) {
            return Some(self.set.get(p.name).cloned().unwrap_or_else(|| p.default.to_string()));
        }
        self.custom.get(&name.to_ascii_lowercase()).cloned()
    }

    /// The statement timeout (`None`: none).
    pub(crate) fn statement_timeout(&self) -> Option<Duration> {
        let ms: u64 = self.get("statement_timeout")?.parse().ok()?;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Every reported parameter with its value: the ParameterStatus
    /// messages a client gets at startup.
    pub(crate) fn reported(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = PARAMETERS.iter().filter(|p| p.reported).map(|p| (p.name, self.get(p.name).unwrap_or_default())).collect();
        out.push(("session_authorization", self.user.clone()));
        out
    }

    /// Applies a parameter of the connection's startup message.
    pub(crate) fn startup(&mut self, name: &str, value: &str) -> Result<(), SettingError> {
        if is_engine_setting(name) {
            return Err(error("0A000", format!("{name} cannot be a startup parameter: it is engine-wide; SET it after connecting")));
        }
        self.assign(name, Some(value)).map(|_| ())
    }

    /// Handles `sql` when it is a `SET`, `RESET` or `SHOW` of a PostgreSQL
    /// parameter (or of a custom one); `None` for any other statement —
    /// blobhouse's own settings included, which the engine handles.
    pub(crate) fn handle(&mut self, sql: &str) -> Option<Result<Outcome, SettingError>> {
        let first = sql.split_whitespace().next()?.to_ascii_lowercase();
        if !matches!(first.as_str(), "set" | "reset" | "show") {
            return None;
        }
        if first == "show" {
            return self.show(sql);
        }
        let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).ok()?;
        let [statement] = statements.as_slice() else { return None };
        match statement {
            Statement::Set(set) => self.set_statement(set),
            Statement::Reset(reset) => match &reset.reset {
                Reset::ALL => {
                    let changed = self.reset_all();
                    Some(Ok(Outcome::Changed(changed)))
                }
                Reset::ConfigurationParameter(name) => {
                    let name = name.to_string();
                    if is_engine_setting(&name) {
                        return None;
                    }
                    Some(self.assign(&name, None))
                }
            },
            _ => None,
        }
    }

    fn set_statement(&mut self, set: &Set) -> Option<Result<Outcome, SettingError>> {
        match set {
            Set::SingleAssignment { variable, values, scope, .. } => {
                let name = variable.to_string();
                if is_engine_setting(&name) {
                    return None;
                }
                if matches!(scope, Some(ContextModifier::Global)) {
                    return Some(Err(error("0A000", "SET GLOBAL is not supported: a parameter is set for the connection (SET or SET SESSION)")));
                }
                let value = match value_text(values) {
                    Ok(v) => v,
                    Err(e) => return Some(Err(e)),
                };
                Some(self.assign(&name, value.as_deref()))
            }
            Set::SetTimeZone { value, .. } => {
                let value = match value_text(std::slice::from_ref(value)) {
                    Ok(v) => v,
                    Err(e) => return Some(Err(e)),
                };
                Some(self.assign("TimeZone", value.as_deref()))
            }
            Set::SetNames { charset_name, .. } => Some(self.assign("client_encoding", Some(&charset_name.value))),
            Set::SetTransaction { modes, snapshot, session } => {
                if snapshot.is_some() {
                    return Some(Err(error("0A000", "SET TRANSACTION SNAPSHOT is not supported; a transaction reads the version of its BEGIN, or give AT(VERSION => n)")));
                }
                let target = if *session { "default_transaction_isolation" } else { "transaction_isolation" };
                let mut changed = Vec::new();
                for mode in modes {
                    let outcome = match mode {
                        TransactionMode::IsolationLevel(level) => self.assign(target, Some(isolation_name(level))),
                        TransactionMode::AccessMode(access) => {
                            let read_only = access.to_string().eq_ignore_ascii_case("read only");
                            self.assign(if *session { "default_transaction_read_only" } else { "transaction_read_only" }, Some(if read_only { "on" } else { "off" }))
                        }
                    };
                    match outcome {
                        Ok(Outcome::Changed(c)) => changed.extend(c),
                        Ok(other) => return Some(Ok(other)),
                        Err(e) => return Some(Err(e)),
                    }
                }
                Some(Ok(Outcome::Changed(changed)))
            }
            Set::SetSessionAuthorization(_) | Set::SetRole { .. } => {
                Some(Err(error("0A000", "SET ROLE and SET SESSION AUTHORIZATION are not supported: a connection acts as the user it logged in as")))
            }
            _ => None,
        }
    }

    /// Sets `name` to `value`, or back to its default (`None`, `DEFAULT`).
    fn assign(&mut self, name: &str, value: Option<&str>) -> Result<Outcome, SettingError> {
        let value = value.filter(|v| !v.eq_ignore_ascii_case("default"));
        let Some(p) = parameter(name) else {
            if name.contains('.') {
                let key = name.to_ascii_lowercase();
                match value {
                    Some(v) => self.custom.insert(key, v.to_string()),
                    None => self.custom.remove(&key),
                };
                return Ok(Outcome::Changed(Vec::new()));
            }
            return Err(unknown(name));
        };
        let before = self.get(p.name);
        match value {
            None => {
                if matches!(p.check, Check::ReadOnly) {
                    return Err(error("55P02", format!("parameter \"{}\" cannot be changed", p.name)));
                }
                self.set.remove(p.name);
            }
            Some(v) => {
                let v = check(p, v)?;
                self.set.insert(p.name, v);
            }
        }
        let after = self.get(p.name);
        Ok(Outcome::Changed(if p.reported && before != after { vec![(p.name, after.unwrap_or_default())] } else { Vec::new() }))
    }

    fn reset_all(&mut self) -> Vec<(&'static str, String)> {
        let before = self.reported();
        self.set.clear();
        self.custom.clear();
        let after = self.reported();
        after.into_iter().filter(|a| !before.contains(a)).collect()
    }

    fn show(&self, sql: &str) -> Option<Result<Outcome, SettingError>> {
        let words: Vec<&str> = sql.trim().trim_end_matches(';').split_whitespace().skip(1).collect();
        let name = words.join(" ").trim_matches('"').to_string();
        if name.eq_ignore_ascii_case("all") {
            let mut rows: Vec<[String; 3]> = PARAMETERS.iter().map(|p| [p.name.to_string(), self.get(p.name).unwrap_or_default(), p.description.to_string()]).collect();
            rows.push(["session_authorization".into(), self.user.clone(), "Sets the session user name.".into()]);
            rows.sort_by_key(|r| r[0].to_ascii_lowercase());
            return Some(Ok(Outcome::Show { column: "name".into(), rows, all: true }));
        }
        let value = self.get(&name)?;
        let column = match parameter(&name) {
            Some(p) if name.eq_ignore_ascii_case("transaction isolation level") => p.name.to_string(),
            Some(p) => p.name.to_ascii_lowercase(),
            None => name.to_ascii_lowercase(),
        };
        Some(Ok(Outcome::Show { column, rows: vec![[value, String::new(), String::new()]], all: false }))
    }
}

/// Every parameter with its default value and description: what
/// `pg_settings` lists.
pub(crate) fn defaults() -> Vec<(&'static str, String, &'static str)> {
    PARAMETERS.iter().map(|p| (p.name, p.default.to_string(), p.description)).collect()
}

/// The error for a name that is no parameter.
pub(crate) fn unknown(name: &str) -> SettingError {
    error("42704", format!("unrecognized configuration parameter \"{name}\" (SHOW ALL lists PostgreSQL's parameters blobhouse answers; blobhouse's own are memory_limit, cache_memory, cache_policy, pushdown and datafusion.*)"))
}

/// A SET's value as text: one word, string or number, or a list (search_path).
fn value_text(values: &[Expr]) -> Result<Option<String>, SettingError> {
    let mut parts = Vec::with_capacity(values.len());
    for v in values {
        let text = match v {
            Expr::Value(v) => match &v.value {
                Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) | Value::EscapedStringLiteral(s) => s.clone(),
                Value::Number(n, _) => n.to_string(),
                Value::Boolean(b) => if *b { "on".into() } else { "off".into() },
                Value::Null => return Err(error("22023", "a parameter cannot be set to NULL; use DEFAULT or RESET")),
                other => other.to_string(),
            },
            Expr::Identifier(id) if id.quote_style.is_some() => format!("\"{}\"", id.value),
            Expr::Identifier(id) => id.value.clone(),
            Expr::UnaryOp { op, expr } => format!("{op}{}", value_text(std::slice::from_ref(expr))?.unwrap_or_default()),
            Expr::Interval(i) => i.value.to_string().trim_matches('\'').to_string(),
            other => other.to_string(),
        };
        parts.push(text);
    }
    Ok(match parts.as_slice() {
        [] => None,
        [one] if one.eq_ignore_ascii_case("default") => None,
        _ => Some(parts.join(", ")),
    })
}

fn isolation_name(level: &TransactionIsolationLevel) -> &'static str {
    match level {
        TransactionIsolationLevel::ReadUncommitted => "read uncommitted",
        TransactionIsolationLevel::ReadCommitted => "read committed",
        TransactionIsolationLevel::RepeatableRead => "repeatable read",
        TransactionIsolationLevel::Serializable => "serializable",
        TransactionIsolationLevel::Snapshot => "repeatable read",
    }
}

/// `value` as `p` keeps it, or why it is refused.
fn check(p: &Parameter, value: &str) -> Result<String, SettingError> {
    // A startup parameter may come quoted (asyncpg sends client_encoding='utf-8').
    let value = value.trim();
    let value = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')).unwrap_or(value);
    let invalid = |why: &str| error("22023", format!("invalid value for parameter \"{}\": \"{value}\"{why}", p.name));
    let lower = value.to_ascii_lowercase();
    match p.check {
        Check::Any => Ok(value.to_string()),
        Check::ReadOnly => Err(error("55P02", format!("parameter \"{}\" cannot be changed", p.name))),
        Check::OneOf(allowed) => {
            if allowed.contains(&lower.as_str()) {
                Ok(lower)
            } else {
                Err(invalid(&format!(" (one of: {})", allowed.join(", "))))
            }
        }
        Check::Only(only, what) => {
            let on = |v: &str| matches!(v, "on" | "true" | "yes" | "1");
            let off = |v: &str| matches!(v, "off" | "false" | "no" | "0");
            let same = lower == only || (only == "on" && on(&lower)) || (only == "off" && off(&lower));
            if same { Ok(only.to_string()) } else { Err(error("0A000", format!("{} = {value} is not supported: {what}", p.name))) }
        }
        Check::Int(min, max) => match lower.parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n.to_string()),
            _ => Err(invalid(&format!(" (an integer from {min} to {max})"))),
        },
        Check::Millis => millis(&lower).map(|ms| ms.to_string()).ok_or_else(|| invalid(" (a duration such as 5000, '5s', '2min'; 0 turns it off)")),
        Check::Encoding => match lower.replace(['-', '_'], "").as_str() {
            "utf8" | "unicode" => Ok("UTF8".to_string()),
            _ => Err(error("0A000", format!("client_encoding = {value} is not supported: blobhouse sends and receives UTF8 only"))),
        },
        Check::DateStyle => {
            let parts: Vec<&str> = lower.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
            let iso = parts.iter().any(|p| *p == "iso");
            let order = parts.iter().find(|p| matches!(**p, "mdy" | "dmy" | "ymd" | "us" | "euro" | "european" | "noneuropean"));
            if !iso && parts.iter().any(|p| matches!(*p, "sql" | "postgres" | "german")) {
                return Err(error("0A000", format!("DateStyle = {value} is not supported: dates and times are shown in the ISO style")));
            }
            let order = match order.copied() {
                Some("dmy" | "euro" | "european") => "DMY",
                Some("ymd") => "YMD",
                _ => "MDY",
            };
            Ok(format!("ISO, {order}"))
        }
        Check::SearchPath => {
            for schema in value.split(',').map(|s| s.trim().trim_matches('"')) {
                let known = ["public", "pg_catalog", "information_schema", "$user", ""];
                if !known.iter().any(|k| k.eq_ignore_ascii_case(schema)) {
                    return Err(error("3F000", format!("schema \"{schema}\" does not exist (blobhouse's tables are in public)")));
                }
            }
            Ok(value.to_string())
        }
        Check::Isolation => match lower.as_str() {
            "read uncommitted" | "read committed" | "repeatable read" => Ok(ISOLATION.to_string()),
            "serializable" => Err(error("0A000", "SERIALIZABLE is not available: blobhouse transactions have snapshot isolation (REPEATABLE READ); see docs/transactions.md")),
            _ => Err(invalid(" (read committed or repeatable read)")),
        },
        Check::Bool => match lower.as_str() {
            "on" | "true" | "yes" | "1" => Ok("on".into()),
            "off" | "false" | "no" | "0" => Ok("off".into()),
            _ => Err(invalid(" (on or off)")),
        },
    }
}

/// PostgreSQL's duration forms in milliseconds: a bare number (ms) or a
/// number and a unit.
fn millis(value: &str) -> Option<u64> {
    let value = value.trim();
    let split = value.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1e3,
        "min" => 60e3,
        "h" => 3600e3,
        "d" => 86_400e3,
        _ => return None,
    };
    let ms = (number * factor).round();
    (ms >= 0.0 && ms <= i32::MAX as f64).then_some(ms as u64)
}

/// `current_setting('name')` and `current_setting('name', missing_ok)`
/// with a literal name become the session's value, as a string literal:
/// the function cannot see the connection it runs for.
pub(crate) fn inline_current_setting(sql: &str, settings: &Settings) -> Option<String> {
    use datafusion::sql::sqlparser::ast::{FunctionArg, FunctionArgExpr, FunctionArguments, visit_expressions_mut};
    if !sql.to_ascii_lowercase().contains("current_setting") {
        return None;
    }
    let mut statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).ok()?;
    let mut changed = false;
    let _ = visit_expressions_mut(&mut statements, |e| {
        if let Expr::Function(f) = e
            && f.name.0.last().is_some_and(|p| p.to_string().eq_ignore_ascii_case("current_setting"))
            && let FunctionArguments::List(list) = &f.args
            && let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(name)))) = list.args.first()
            && let Value::SingleQuotedString(name) = &name.value
        {
            let missing_ok = matches!(list.args.get(1), Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v)))) if v.value == Value::Boolean(true));
            match settings.get(name) {
                Some(value) => {
                    *e = Expr::value(Value::SingleQuotedString(value));
                    changed = true;
                }
                None if missing_ok => {
                    *e = Expr::value(Value::Null);
                    changed = true;
                }
                None => {}
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    changed.then(|| statements.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &mut Settings, sql: &str) -> Result<Outcome, SettingError> {
        s.handle(sql).unwrap_or_else(|| panic!("{sql} is a parameter statement"))
    }

    fn show(s: &mut Settings, name: &str) -> String {
        match set(s, &format!("SHOW {name}")) {
            Ok(Outcome::Show { rows, .. }) => rows[0][0].clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn what_drivers_send_on_connecting_is_accepted_and_read_back() {
        let mut s = Settings::new("alice");
        for sql in [
            "SET application_name = 'PostgreSQL JDBC Driver'",
            "SET extra_float_digits = 3",
            "SET search_path TO public, \"$user\"",
            "SET TIME ZONE 'UTC'",
            "SET statement_timeout = '5s'",
            "SET DateStyle = 'ISO'",
            "SET client_min_messages TO WARNING",
            "SET client_encoding TO 'UTF8'",
            "SET NAMES 'utf-8'",
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED",
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            "SET default_transaction_isolation = 'read committed'",
            "SET SESSION myapp.tenant = 'acme'",
        ] {
            assert!(set(&mut s, sql).is_ok(), "{sql}: {:?}", set(&mut s, sql));
        }
        assert_eq!(show(&mut s, "application_name"), "PostgreSQL JDBC Driver");
        assert_eq!(show(&mut s, "extra_float_digits"), "3");
        assert_eq!(show(&mut s, "statement_timeout"), "5000");
        assert_eq!(s.statement_timeout(), Some(Duration::from_secs(5)));
        assert_eq!(show(&mut s, "DateStyle"), "ISO, MDY");
        assert_eq!(show(&mut s, "transaction isolation level"), "repeatable read");
        assert_eq!(show(&mut s, "myapp.tenant"), "acme");
        assert_eq!(show(&mut s, "session_authorization"), "alice");
        assert!(matches!(set(&mut s, "RESET statement_timeout"), Ok(Outcome::Changed(c)) if c.is_empty()));
        assert_eq!(s.statement_timeout(), None);
        // A change to a reported parameter is reported.
        assert_eq!(set(&mut s, "SET application_name TO 'psql'"), Ok(Outcome::Changed(vec![("application_name", "psql".into())])));
        assert!(matches!(set(&mut s, "RESET ALL"), Ok(Outcome::Changed(c)) if c == vec![("application_name", String::new())]));
        assert_eq!(show(&mut s, "application_name"), "");
    }

    #[test]
    fn values_blobhouse_cannot_honour_are_refused_with_reasons() {
        let mut s = Settings::new("alice");
        let code = |s: &mut Settings, sql: &str| set(s, sql).expect_err(sql).sqlstate;
        assert_eq!(code(&mut s, "SET no_such_parameter = 1"), "42704");
        assert_eq!(code(&mut s, "SET client_encoding = 'LATIN1'"), "0A000");
        assert_eq!(code(&mut s, "SET DateStyle = 'German'"), "0A000");
        assert_eq!(code(&mut s, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"), "0A000");
        assert_eq!(code(&mut s, "SET default_transaction_read_only = on"), "0A000");
        assert_eq!(code(&mut s, "SET search_path = sales"), "3F000");
        assert_eq!(code(&mut s, "SET extra_float_digits = 9"), "22023");
        assert_eq!(code(&mut s, "SET statement_timeout = 'soon'"), "22023");
        assert_eq!(code(&mut s, "SET server_version = '17'"), "55P02");
        let e = set(&mut s, "SET no_such_parameter = 1").unwrap_err().message;
        assert!(e.contains("unrecognized configuration parameter \"no_such_parameter\""), "{e}");
        // blobhouse's own settings and other statements are not this module's.
        for sql in ["SET memory_limit = '1G'", "SET datafusion.execution.batch_size = 100", "SHOW TABLES", "SHOW memory_limit", "SELECT 1", "RESET cache_memory"] {
            assert!(s.handle(sql).is_none(), "{sql}");
        }
    }

    #[test]
    fn current_setting_reads_the_connection() {
        let mut s = Settings::new("alice");
        set(&mut s, "SET application_name = 'x'").expect("set");
        let sql = inline_current_setting("SELECT current_setting('application_name'), current_setting('max_index_keys'), current_setting('nope.x', true)", &s).expect("inlined");
        assert_eq!(sql, "SELECT 'x', '32', NULL");
        assert!(inline_current_setting("SELECT 1", &s).is_none());
    }
}
