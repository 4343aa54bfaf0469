//! Settings: `SET`, `RESET`, `SHOW`, `current_setting()` and a client's
//! startup parameters, all through one registry ([`registry`]).
//!
//! A session's own settings live in its [`Values`]; an engine setting is
//! read from and applied to the [`Engine`] (every session sees the
//! change). DataFusion's `datafusion.*` options are DataFusion's own and
//! go to its planner, per session.

pub mod registry;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{ContextModifier, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Reset, Set, Statement, TransactionIsolationLevel, TransactionMode, Value, visit_expressions_mut};
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, Word};

pub use registry::{Check, SETTINGS, Scope, Setting, lookup, markdown_table};

pub use crate::error::SettingFault;

use crate::engine::Engine;
use crate::memory::{format_bytes, parse_limit};
use crate::result::{QueryResult, empty_result, setting_result};
use crate::EngineError;

fn fault(fault: SettingFault, message: impl Into<String>) -> EngineError {
    EngineError::Setting { fault, message: message.into() }
}

fn unknown(name: &str) -> EngineError {
    fault(SettingFault::Unknown, format!("unrecognized configuration parameter \"{name}\" (SHOW ALL lists the settings; docs/settings.md explains them)"))
}

/// A statement about settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SettingStatement {
    /// `SET name = value` (`None`: DEFAULT); several for `SET TRANSACTION`
    /// with several modes.
    Set(Vec<(String, Option<String>)>),
    /// `RESET name`.
    Reset(String),
    ResetAll,
    /// `SHOW name`.
    Show(String),
    ShowAll,
    /// A form blobhouse refuses (SET GLOBAL, SET ROLE, …), and why.
    Refused(SettingFault, String),
}

/// Parses a `SET`, `RESET` or `SHOW` of a setting at the parser's
/// position; `None`, with nothing consumed, for any other statement —
/// DataFusion's `datafusion.*` options, SHOW TABLES and the like included.
pub(crate) fn statement(p: &mut Parser) -> Result<Option<SettingStatement>, ParserError> {
    let word = |n: usize| match p.peek_nth_token(n).token {
        Token::Word(Word { value, quote_style: None, .. }) => Some(value.to_ascii_lowercase()),
        _ => None,
    };
    let first = word(0);
    let Some(first) = first.filter(|w| matches!(w.as_str(), "set" | "reset" | "show")) else { return Ok(None) };
    // The name's first word (after SESSION / LOCAL / GLOBAL).
    let mut at = 1;
    while matches!(word(at).as_deref(), Some("session" | "local" | "global")) && p.peek_nth_token(at + 1).token != Token::Eq {
        at += 1;
    }
    if word(at).as_deref() == Some("datafusion") && p.peek_nth_token(at + 1).token == Token::Period {
        // DataFusion's own, unless the registry knows it by that name.
        let mut name = String::new();
        let mut n = at;
        while let Token::Word(w) = p.peek_nth_token(n).token {
            name.push_str(&w.value);
            if p.peek_nth_token(n + 1).token != Token::Period {
                break;
            }
            name.push('.');
            n += 2;
        }
        if lookup(&name).is_none() {
            return Ok(None);
        }
    }
    if first == "show" {
        // The words up to the end: `SHOW TRANSACTION ISOLATION LEVEL`, `SHOW a.b`.
        let mut name = String::new();
        let mut n = 1;
        loop {
            match p.peek_nth_token(n).token {
                Token::EOF | Token::SemiColon => break,
                Token::Word(w) => {
                    if !name.is_empty() && !name.ends_with('.') {
                        name.push(' ');
                    }
                    name.push_str(&w.value);
                }
                Token::Period => name.push('.'),
                _ => return Ok(None),
            }
            n += 1;
        }
        let known = name.eq_ignore_ascii_case("all") || lookup(&name).is_some() || is_user_name(&name) || (name.contains('.') && !name.contains(' '));
        if !known {
            return Ok(None);
        }
        for _ in 0..n {
            p.next_token();
        }
        return Ok(Some(if name.eq_ignore_ascii_case("all") { SettingStatement::ShowAll } else { SettingStatement::Show(name) }));
    }
    let statement = p.parse_statement()?;
    Ok(Some(match statement {
        Statement::Set(set) => set_statement(set),
        Statement::Reset(reset) => match reset.reset {
            Reset::ALL => SettingStatement::ResetAll,
            Reset::ConfigurationParameter(name) => SettingStatement::Reset(name.to_string()),
        },
        other => SettingStatement::Refused(SettingFault::Unsupported, format!("'{other}' is not supported")),
    }))
}

fn is_user_name(name: &str) -> bool {
    name.eq_ignore_ascii_case("session_authorization") || name.eq_ignore_ascii_case("current_user")
}

fn set_statement(set: Set) -> SettingStatement {
    let refused = |m: &str| SettingStatement::Refused(SettingFault::Unsupported, m.to_string());
    match set {
        Set::SingleAssignment { variable, values, scope, .. } => {
            if matches!(scope, Some(ContextModifier::Global)) {
                return refused("SET GLOBAL is not supported: a parameter is set for the connection (SET or SET SESSION)");
            }
            match value_text(&values) {
                Ok(v) => SettingStatement::Set(vec![(variable.to_string(), v)]),
                Err(e) => SettingStatement::Refused(SettingFault::Invalid, e.to_string()),
            }
        }
        Set::SetTimeZone { value, .. } => match value_text(std::slice::from_ref(&value)) {
            Ok(v) => SettingStatement::Set(vec![("TimeZone".into(), v)]),
            Err(e) => SettingStatement::Refused(SettingFault::Invalid, e.to_string()),
        },
        Set::SetNames { charset_name, .. } => SettingStatement::Set(vec![("client_encoding".into(), Some(charset_name.value))]),
        Set::SetTransaction { modes, snapshot, session } => {
            if snapshot.is_some() {
                return refused("SET TRANSACTION SNAPSHOT is not supported; a transaction reads the version of its BEGIN, or give AT(VERSION => n)");
            }
            let mut assignments = Vec::new();
            for mode in modes {
                match mode {
                    TransactionMode::IsolationLevel(level) => {
                        assignments.push((if session { "default_transaction_isolation" } else { "transaction_isolation" }.to_string(), Some(isolation_name(&level).to_string())))
                    }
                    TransactionMode::AccessMode(access) => {
                        let read_only = access.to_string().eq_ignore_ascii_case("read only");
                        assignments.push((if session { "default_transaction_read_only" } else { "transaction_read_only" }.to_string(), Some(if read_only { "on" } else { "off" }.to_string())));
                    }
                }
            }
            SettingStatement::Set(assignments)
        }
        Set::SetSessionAuthorization(_) | Set::SetRole { .. } => refused("SET ROLE and SET SESSION AUTHORIZATION are not supported: a connection acts as the user it logged in as"),
        other => SettingStatement::Refused(SettingFault::Unsupported, format!("'{other}' is not supported")),
    }
}

/// One session's settings: what it set over the defaults.
#[derive(Debug, Clone, Default)]
pub struct Values {
    /// Values set in this session (by canonical name).
    set: BTreeMap<&'static str, String>,
    /// Custom parameters (`myapp.tenant`): PostgreSQL keeps any dotted
    /// name a client sets.
    custom: BTreeMap<String, String>,
    /// The user name (`session_authorization`).
    user: String,
}

impl Values {
    /// The defaults, for `user`.
    pub fn for_user(user: &str) -> Values {
        Values { user: user.to_string(), ..Values::default() }
    }

    /// The value of session setting `name` (or of a custom one); `None`
    /// for an engine setting or an unknown name.
    pub fn get(&self, name: &str) -> Option<String> {
        if is_user_name(name) {
            return Some(self.user.clone());
        }
        if let Some(s) = lookup(name) {
            return (s.scope == Scope::Session).then(|| self.set.get(s.name).cloned().unwrap_or_else(|| s.default.to_string()));
        }
        self.custom.get(&name.to_ascii_lowercase()).cloned()
    }

    /// The statement timeout (`None`: none).
    pub fn statement_timeout(&self) -> Option<Duration> {
        let ms: u64 = self.get("statement_timeout")?.parse().ok()?;
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Every reported setting with its value: what a PostgreSQL client is
    /// sent at startup and whenever one changes (ParameterStatus).
    pub fn reported(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = SETTINGS.iter().filter(|s| s.reported).map(|s| (s.name, self.get(s.name).unwrap_or_default())).collect();
        out.push(("session_authorization", self.user.clone()));
        out
    }

    /// Applies a parameter of a client's startup message (session
    /// settings only: engine settings are for SET after connecting).
    pub fn startup(&mut self, name: &str, value: &str) -> Result<(), EngineError> {
        if lookup(name).is_some_and(|s| s.scope == Scope::Engine) || name.to_ascii_lowercase().starts_with("datafusion.") {
            return Err(fault(SettingFault::Unsupported, format!("{name} cannot be a startup parameter: it is engine-wide; SET it after connecting")));
        }
        self.assign(name, Some(value))
    }

    /// Sets session setting `name` to `value`, or back to its default.
    fn assign(&mut self, name: &str, value: Option<&str>) -> Result<(), EngineError> {
        let value = value.filter(|v| !v.eq_ignore_ascii_case("default"));
        let Some(s) = lookup(name) else {
            if name.contains('.') {
                let key = name.to_ascii_lowercase();
                match value {
                    Some(v) => self.custom.insert(key, v.to_string()),
                    None => self.custom.remove(&key),
                };
                return Ok(());
            }
            return Err(unknown(name));
        };
        match value {
            None if matches!(s.check, Check::ReadOnly) => return Err(fault(SettingFault::ReadOnly, format!("parameter \"{}\" cannot be changed", s.name))),
            None => {
                self.set.remove(s.name);
            }
            Some(v) => {
                let v = registry::check(s, v).map_err(|(f, m)| fault(f, m))?;
                self.set.insert(s.name, v);
            }
        }
        Ok(())
    }
}

/// The value of engine setting `s` now.
pub(crate) fn engine_value(engine: &Engine, s: &Setting) -> String {
    let memory_tier = || engine.tiers().and_then(|t| t.describe().into_iter().find(|r| r.tier == "memory"));
    match s.name {
        "memory_limit" => engine.memory().limit().map_or("none".to_string(), |l| format_bytes(l as u64)),
        "cache_memory" => memory_tier().map_or("off".to_string(), |r| format_bytes(r.capacity)),
        "cache_policy" => memory_tier().map_or("off".to_string(), |r| r.policy.to_string()),
        "pushdown" => engine.pushdown().map_or("off".to_string(), |p| format!("{:?}", p.mode()).to_ascii_lowercase()),
        "pushdown_bloom" => engine.pushdown().map_or("off", |p| if p.bloom() { "on" } else { "off" }).to_string(),
        other => unreachable!("{other} is not an engine setting"),
    }
}

/// Sets engine setting `s` to `value`, or back to what the engine was
/// opened with (`None`).
fn apply_engine(engine: &Engine, s: &Setting, value: Option<&str>) -> Result<(), EngineError> {
    let invalid = |message: String| fault(SettingFault::Invalid, format!("SET {}: {message}", s.name));
    let value = value.map(|v| v.trim().trim_matches('\'').to_string()).filter(|v| !v.eq_ignore_ascii_case("default"));
    match s.name {
        "memory_limit" => {
            let limit = match &value {
                Some(v) => parse_limit(v).map_err(invalid)?,
                None => engine.options().memory_limit,
            };
            engine.set_memory_limit(limit);
            Ok(())
        }
        "cache_memory" | "cache_policy" => {
            let tiers = engine.tiers().ok_or_else(|| invalid("this engine has no caching tiers (it was opened with the caches off)".into()))?;
            if s.name == "cache_memory" {
                // 0 (or 'off') empties the tier and stops it admitting.
                let bytes = value.map(|t| crate::tiers::parse_cache_size(&t)).transpose().map_err(invalid)?;
                tiers.set_memory_capacity(bytes).map_err(invalid)
            } else {
                let policy = value.map(|t| blobhouse_cache::PolicyKind::parse(&t).ok_or_else(|| invalid(format!("unknown policy '{t}': use 'lru', 'lfu' or 'wlfu'")))).transpose()?;
                tiers.set_memory_policy(policy).map_err(invalid)
            }
        }
        "pushdown" | "pushdown_bloom" => {
            let p = engine.pushdown().ok_or_else(|| invalid("this engine has no storage node (open it with --storage-node URL)".into()))?;
            if s.name == "pushdown_bloom" {
                let on = match value.map(|v| v.to_ascii_lowercase()) {
                    None => true,
                    Some(v) if v == "on" || v == "true" => true,
                    Some(v) if v == "off" || v == "false" => false,
                    Some(v) => return Err(invalid(format!("'{v}' is not on or off"))),
                };
                p.set_bloom(on);
                return Ok(());
            }
            let mode = match value {
                None => engine.options().pushdown.as_ref().map_or(crate::hybrid::PushdownMode::Off, |o| o.mode),
                Some(t) => crate::hybrid::PushdownMode::parse(&t).ok_or_else(|| invalid(format!("unknown mode '{t}': use 'off', 'on' or 'auto'")))?,
            };
            p.set_mode(mode);
            Ok(())
        }
        other => unreachable!("{other} is not an engine setting"),
    }
}

/// The value of any setting as session `values` and `engine` see it.
pub(crate) fn value(engine: &Engine, values: &Values, name: &str) -> Option<String> {
    match lookup(name) {
        Some(s) if s.scope == Scope::Engine => Some(engine_value(engine, s)),
        _ => values.get(name),
    }
}

/// Runs a settings statement.
pub(crate) fn run(engine: &Engine, values: &std::sync::Mutex<Values>, statement: SettingStatement, started: Instant) -> Result<QueryResult, EngineError> {
    let mut values = values.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let assign = |values: &mut Values, name: &str, value: Option<&str>| match lookup(name) {
        Some(s) if s.scope == Scope::Engine => apply_engine(engine, s, value),
        _ => values.assign(name, value),
    };
    match statement {
        SettingStatement::Refused(f, message) => Err(fault(f, message)),
        SettingStatement::Set(assignments) => {
            for (name, value) in assignments {
                assign(&mut values, &name, value.as_deref())?;
            }
            Ok(empty_result(started))
        }
        SettingStatement::Reset(name) => {
            assign(&mut values, &name, None)?;
            Ok(empty_result(started))
        }
        SettingStatement::ResetAll => {
            values.set.clear();
            values.custom.clear();
            Ok(empty_result(started))
        }
        SettingStatement::Show(name) => {
            let name = name.trim_matches('"').to_string();
            // blobhouse's engine settings answer (name, value), as DataFusion's do.
            if let Some(s) = lookup(&name).filter(|s| s.scope == Scope::Engine) {
                return Ok(setting_result(s.name, &engine_value(engine, s), started));
            }
            let value = values.get(&name).ok_or_else(|| unknown(&name))?;
            let column = match lookup(&name) {
                Some(s) if name.eq_ignore_ascii_case("transaction isolation level") => s.name.to_string(),
                Some(s) => s.name.to_ascii_lowercase(),
                None => name.to_ascii_lowercase(),
            };
            let schema = Arc::new(Schema::new(vec![Field::new(column, DataType::Utf8, false)]));
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(vec![value])) as ArrayRef]).expect("one string column");
            Ok(QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) })
        }
        SettingStatement::ShowAll => {
            let mut rows: Vec<[String; 3]> = SETTINGS.iter().map(|s| [s.name.to_string(), value(engine, &values, s.name).unwrap_or_default(), s.description.to_string()]).collect();
            rows.push(["session_authorization".into(), values.user.clone(), "Sets the session user name.".into()]);
            rows.sort_by_key(|r| r[0].to_ascii_lowercase());
            let schema = Arc::new(Schema::new(["name", "setting", "description"].map(|n| Field::new(n, DataType::Utf8, false)).to_vec()));
            let columns: Vec<ArrayRef> = (0..3).map(|i| Arc::new(rows.iter().map(|r| Some(r[i].as_str())).collect::<StringArray>()) as ArrayRef).collect();
            let batch = RecordBatch::try_new(schema.clone(), columns).expect("three string columns");
            Ok(QueryResult { batches: vec![batch], ..empty_result(started).with_schema(schema) })
        }
    }
}

/// Every session setting with its default and description: what
/// `pg_settings` lists (engine settings are read with SHOW).
pub fn session_defaults() -> Vec<(&'static str, &'static str, &'static str)> {
    SETTINGS.iter().filter(|s| s.scope == Scope::Session).map(|s| (s.name, s.default, s.description)).collect()
}

/// `current_setting('name')` and `current_setting('name', missing_ok)`
/// with a literal name become the setting's value, as a string literal:
/// a function cannot see the session it runs for.
pub(crate) fn inline_current_setting(statement: &mut DFStatement, get: impl Fn(&str) -> Option<String>) {
    match statement {
        DFStatement::Statement(s) => inline_current_setting_in(s, &get),
        DFStatement::Explain(e) => inline_current_setting(&mut e.statement, get),
        _ => {}
    }
}

/// [`inline_current_setting`] in one of sqlparser's statements.
pub(crate) fn inline_current_setting_in(statement: &mut Statement, get: &dyn Fn(&str) -> Option<String>) {
    let _ = visit_expressions_mut(statement, |e| {
        if let Expr::Function(f) = e
            && f.name.0.last().is_some_and(|p| p.to_string().eq_ignore_ascii_case("current_setting"))
            && let FunctionArguments::List(list) = &f.args
            && let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(name)))) = list.args.first()
            && let Value::SingleQuotedString(name) = &name.value
        {
            let missing_ok = matches!(list.args.get(1), Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v)))) if v.value == Value::Boolean(true));
            match get(name) {
                Some(value) => *e = Expr::value(Value::SingleQuotedString(value)),
                None if missing_ok => *e = Expr::value(Value::Null),
                None => {}
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
}

/// A SET's value as text: one word, string or number, or a list (search_path).
pub(crate) fn value_text(values: &[Expr]) -> Result<Option<String>, EngineError> {
    let mut parts = Vec::with_capacity(values.len());
    for v in values {
        let text = match v {
            Expr::Value(v) => match &v.value {
                Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) | Value::EscapedStringLiteral(s) => s.clone(),
                Value::Number(n, _) => n.to_string(),
                Value::Boolean(b) => if *b { "on".into() } else { "off".into() },
                Value::Null => return Err(fault(SettingFault::Invalid, "a parameter cannot be set to NULL; use DEFAULT or RESET")),
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
