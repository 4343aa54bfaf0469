//! The registry of settings: every name `SET`, `SHOW`, `RESET`,
//! `current_setting()`, `pg_settings` and a PostgreSQL client's startup
//! parameters know, with its type, default, scope and the values it takes.
//! One table drives them all, and docs/settings.md is checked against it
//! (a test), so a setting cannot exist in one place and not another.
//!
//! Two scopes: a *session* setting belongs to one connection (PostgreSQL's
//! run-time parameters, which drivers and ORMs set on connecting); an
//! *engine* setting changes the process for every session (the memory
//! budget, the caches, pushdown). Each PostgreSQL parameter either changes
//! what blobhouse does (`statement_timeout` stops statements), describes
//! what it does (`transaction_isolation` is snapshot isolation, which
//! PostgreSQL calls repeatable read), or is kept for the client to read
//! back (`application_name`). A value blobhouse cannot honour is refused
//! with an error that says what it does instead — never accepted and
//! silently ignored where it would change answers.

use crate::error::SettingFault;

/// A setting.
pub struct Setting {
    /// As PostgreSQL spells it in `SHOW ALL` (names match without case).
    pub name: &'static str,
    /// Its value until set; for an engine setting, what an engine is opened
    /// with unless told otherwise (in words: it depends on the machine).
    pub default: &'static str,
    pub check: Check,
    /// Session or engine.
    pub scope: Scope,
    /// Other names it answers to (PostgreSQL's and blobhouse's older spellings).
    pub aliases: &'static [&'static str],
    /// Sent to the client in a ParameterStatus message when it changes
    /// (PostgreSQL's GUC_REPORT list).
    pub reported: bool,
    pub description: &'static str,
}

/// What a parameter accepts.
#[derive(Clone, Copy)]
pub enum Check {
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
    /// A size (`4G`, `512MB`, `60%` of the machine's memory), or `none`.
    Size,
}

/// Whose a setting is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One connection's.
    Session,
    /// The engine's, for every session.
    Engine,
}

pub(crate) const ISOLATION: &str = "repeatable read";

/// Every setting, PostgreSQL's by name, then blobhouse's engine settings.
pub const SETTINGS: &[Setting] = &[
    Setting { name: "application_name", default: "", scope: Scope::Session, aliases: &[], check: Check::Any, reported: true, description: "Sets the application name to be reported in statistics and logs." },
    Setting { name: "bytea_output", default: "hex", scope: Scope::Session, aliases: &[], check: Check::Only("hex", "BYTEA values are sent in the hex format"), reported: false, description: "Sets the output format for bytea." },
    Setting { name: "client_encoding", default: "UTF8", scope: Scope::Session, aliases: &[], check: Check::Encoding, reported: true, description: "Sets the client's character set encoding." },
    Setting { name: "client_min_messages", default: "notice", scope: Scope::Session, aliases: &[], check: Check::OneOf(&["debug5", "debug4", "debug3", "debug2", "debug1", "debug", "log", "notice", "warning", "error"]), reported: false, description: "Sets the message levels that are sent to the client." },
    Setting { name: "DateStyle", default: "ISO, MDY", scope: Scope::Session, aliases: &[], check: Check::DateStyle, reported: true, description: "Sets the display format for date and time values." },
    Setting { name: "default_transaction_isolation", default: ISOLATION, scope: Scope::Session, aliases: &["session characteristics"], check: Check::Isolation, reported: false, description: "Sets the transaction isolation level of each new transaction." },
    Setting { name: "default_transaction_read_only", default: "off", scope: Scope::Session, aliases: &[], check: Check::Only("off", "read-only transactions are not supported; every transaction may write"), reported: true, description: "Sets the default read-only status of new transactions." },
    Setting { name: "default_table_access_method", default: "heap", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: false, description: "Sets the default table access method for new tables." },
    Setting { name: "extra_float_digits", default: "1", scope: Scope::Session, aliases: &[], check: Check::Int(-15, 3), reported: false, description: "Sets the number of digits displayed for floating-point values (blobhouse always sends the shortest exact form)." },
    Setting { name: "idle_in_transaction_session_timeout", default: "0", scope: Scope::Session, aliases: &[], check: Check::Millis, reported: false, description: "Sets the maximum allowed idle time between queries, when in a transaction (accepted, not enforced)." },
    Setting { name: "integer_datetimes", default: "on", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: true, description: "Shows whether datetimes are integer based." },
    Setting { name: "IntervalStyle", default: "postgres", scope: Scope::Session, aliases: &[], check: Check::Only("postgres", "intervals are shown in the postgres style"), reported: true, description: "Sets the display format for interval values." },
    Setting { name: "is_superuser", default: "on", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: true, description: "Shows whether the current user is a superuser." },
    Setting { name: "jit", default: "off", scope: Scope::Session, aliases: &[], check: Check::Bool, reported: false, description: "Allow JIT compilation (blobhouse has none)." },
    Setting { name: "lc_collate", default: "C", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: false, description: "Shows the collation order locale." },
    Setting { name: "lc_ctype", default: "C", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: false, description: "Shows the character classification and case conversion locale." },
    Setting { name: "lock_timeout", default: "0", scope: Scope::Session, aliases: &[], check: Check::Millis, reported: false, description: "Sets the maximum allowed duration of any wait for a lock (blobhouse takes no locks)." },
    Setting { name: "max_identifier_length", default: "63", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: false, description: "Shows the maximum identifier length." },
    Setting { name: "max_index_keys", default: "32", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: false, description: "Shows the maximum number of index keys." },
    Setting { name: "row_security", default: "on", scope: Scope::Session, aliases: &[], check: Check::Bool, reported: false, description: "Enable row security." },
    Setting { name: "search_path", default: "\"$user\", public", scope: Scope::Session, aliases: &[], check: Check::SearchPath, reported: false, description: "Sets the schema search order for names that are not schema-qualified." },
    Setting { name: "server_encoding", default: "UTF8", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: true, description: "Shows the server (database) character set encoding." },
    Setting { name: "server_version", default: "16.0", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: true, description: "Shows the server version." },
    Setting { name: "server_version_num", default: "160000", scope: Scope::Session, aliases: &[], check: Check::ReadOnly, reported: false, description: "Shows the server version as an integer." },
    Setting { name: "standard_conforming_strings", default: "on", scope: Scope::Session, aliases: &[], check: Check::Only("on", "backslashes in ordinary string literals are ordinary characters"), reported: true, description: "Causes '...' strings to treat backslashes literally." },
    Setting { name: "statement_timeout", default: "0", scope: Scope::Session, aliases: &[], check: Check::Millis, reported: false, description: "Sets the maximum allowed duration of any statement." },
    Setting { name: "TimeZone", default: "UTC", scope: Scope::Session, aliases: &["time zone", "timezone"], check: Check::Any, reported: true, description: "Sets the time zone for displaying and interpreting time stamps (blobhouse computes and shows timestamps in UTC)." },
    Setting { name: "transaction_isolation", default: ISOLATION, scope: Scope::Session, aliases: &["transaction isolation level"], check: Check::Isolation, reported: false, description: "Sets the current transaction's isolation level." },
    Setting { name: "transaction_read_only", default: "off", scope: Scope::Session, aliases: &[], check: Check::Only("off", "read-only transactions are not supported; every transaction may write"), reported: false, description: "Sets the current transaction's read-only status." },
    Setting { name: "memory_limit", default: "half the machine's memory (--memory-limit)", scope: Scope::Engine, aliases: &["blobhouse.memory_limit", "datafusion.runtime.memory_limit"], check: Check::Size, reported: false, description: "The engine's memory budget, shared by every statement: operators spill beyond it, or the statement fails naming the largest consumers (docs/memory.md)." },
    Setting { name: "cache_memory", default: "a quarter of memory_limit (--cache-memory)", scope: Scope::Engine, aliases: &["blobhouse.cache_memory"], check: Check::Size, reported: false, description: "Bytes of the memory caching tier; 0 empties it and stops it admitting (docs/cache.md)." },
    Setting { name: "cache_policy", default: "lfu", scope: Scope::Engine, aliases: &["blobhouse.cache_policy"], check: Check::OneOf(&["lru", "lfu", "wlfu"]), reported: false, description: "What the memory caching tier keeps (docs/cache.md)." },
    Setting { name: "pushdown", default: "off (--pushdown with --storage-node)", scope: Scope::Engine, aliases: &["blobhouse.pushdown"], check: Check::OneOf(&["off", "on", "auto"]), reported: false, description: "Whether scans push filters and aggregations to the storage node (docs/pushdown.md)." },
    Setting { name: "pushdown_bloom", default: "on", scope: Scope::Engine, aliases: &["blobhouse.pushdown_bloom"], check: Check::Bool, reported: false, description: "Whether hash joins send Bloom filters of their keys to the storage node (docs/pushdown.md)." },
];

/// The setting `name` names (any case, or one of its aliases).
pub fn lookup(name: &str) -> Option<&'static Setting> {
    let name = name.trim().trim_matches('"');
    SETTINGS.iter().find(|s| s.name.eq_ignore_ascii_case(name) || s.aliases.iter().any(|a| a.eq_ignore_ascii_case(name)))
}

/// `value` as `p` keeps it, or why it is refused.
pub(crate) fn check(p: &Setting, value: &str) -> Result<String, (SettingFault, String)> {
    // A startup parameter may come quoted (asyncpg sends client_encoding='utf-8').
    let value = value.trim();
    let value = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')).unwrap_or(value);
    let invalid = |why: &str| (SettingFault::Invalid, format!("invalid value for parameter \"{}\": \"{value}\"{why}", p.name));
    let lower = value.to_ascii_lowercase();
    match p.check {
        Check::Any => Ok(value.to_string()),
        Check::ReadOnly => Err((SettingFault::ReadOnly, format!("parameter \"{}\" cannot be changed", p.name))),
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
            if same { Ok(only.to_string()) } else { Err((SettingFault::Unsupported, format!("{} = {value} is not supported: {what}", p.name))) }
        }
        Check::Int(min, max) => match lower.parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n.to_string()),
            _ => Err(invalid(&format!(" (an integer from {min} to {max})"))),
        },
        Check::Millis => millis(&lower).map(|ms| ms.to_string()).ok_or_else(|| invalid(" (a duration such as 5000, '5s', '2min'; 0 turns it off)")),
        Check::Encoding => match lower.replace(['-', '_'], "").as_str() {
            "utf8" | "unicode" => Ok("UTF8".to_string()),
            _ => Err((SettingFault::Unsupported, format!("client_encoding = {value} is not supported: blobhouse sends and receives UTF8 only"))),
        },
        Check::DateStyle => {
            let parts: Vec<&str> = lower.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
            let iso = parts.iter().any(|p| *p == "iso");
            let order = parts.iter().find(|p| matches!(**p, "mdy" | "dmy" | "ymd" | "us" | "euro" | "european" | "noneuropean"));
            if !iso && parts.iter().any(|p| matches!(*p, "sql" | "postgres" | "german")) {
                return Err((SettingFault::Unsupported, format!("DateStyle = {value} is not supported: dates and times are shown in the ISO style")));
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
                    return Err((SettingFault::NoSchema, format!("schema \"{schema}\" does not exist (blobhouse's tables are in public)")));
                }
            }
            Ok(value.to_string())
        }
        Check::Isolation => match lower.as_str() {
            "read uncommitted" | "read committed" | "repeatable read" => Ok(ISOLATION.to_string()),
            "serializable" => Err((SettingFault::Unsupported, "SERIALIZABLE is not available: blobhouse transactions have snapshot isolation (REPEATABLE READ); see docs/transactions.md".to_string())),
            _ => Err(invalid(" (read committed or repeatable read)")),
        },
        Check::Bool => match lower.as_str() {
            "on" | "true" | "yes" | "1" => Ok("on".into()),
            "off" | "false" | "no" | "0" => Ok("off".into()),
            _ => Err(invalid(" (on or off)")),
        },
        Check::Size => match lower.as_str() {
            "none" | "unlimited" => Ok("none".into()),
            _ => crate::memory::parse_size(value).map(|_| value.to_string()).map_err(|e| (SettingFault::Invalid, format!("{}: {e}", p.name))),
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


impl Check {
    /// The values it takes, for people (the docs' table).
    pub fn describe(&self) -> String {
        match self {
            Check::Any => "any text".into(),
            Check::ReadOnly => "read only".into(),
            Check::OneOf(values) => values.join(", "),
            Check::Only(value, _) => format!("{value} only"),
            Check::Int(min, max) => format!("an integer from {min} to {max}"),
            Check::Millis => "a duration: ms (default), s, min, h, d; 0 is off".into(),
            Check::Encoding => "UTF8 only".into(),
            Check::DateStyle => "ISO, with MDY, DMY or YMD".into(),
            Check::SearchPath => "public, pg_catalog, information_schema".into(),
            Check::Isolation => "read committed, repeatable read (both snapshot isolation)".into(),
            Check::Bool => "on, off".into(),
            Check::Size => "a size (4G, 512MB, 60% of memory) or none".into(),
        }
    }
}

/// The registry as a markdown table: docs/settings.md holds exactly this
/// (a test checks it), so the docs cannot drift from the code.
pub fn markdown_table() -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from("| setting | scope | default | values | also named | description |\n|---|---|---|---|---|---|\n");
    for s in SETTINGS {
        let scope = match s.scope {
            Scope::Session => "session",
            Scope::Engine => "engine",
        };
        let default = if s.default.is_empty() { "(empty)".to_string() } else { format!("`{}`", cell(s.default)) };
        let aliases = s.aliases.iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(", ");
        out += &format!("| `{}` | {scope} | {default} | {} | {aliases} | {} |\n", s.name, cell(&s.check.describe()), cell(s.description));
    }
    out
}
