//! Statements about the database's history: snapshots, versions, restore.
//!
//! ```sql
//! CREATE SNAPSHOT name [AT(VERSION => n)]     -- names a version; copies nothing
//! DROP SNAPSHOT [IF EXISTS] name
//! SHOW SNAPSHOTS                              -- name, version, created, bytes pinned
//! SHOW VERSIONS [n]                           -- the newest n versions (default 100)
//! SHOW STORAGE                                -- bytes by table, by snapshot, awaiting VACUUM
//! RESTORE DATABASE TO VERSION n | TIMESTAMP '…' | SNAPSHOT name
//! RESTORE TABLE t [, u …] TO VERSION n | TIMESTAMP '…' | SNAPSHOT name
//! VACUUM [RETAIN '7 days'] [GRACE '1 day'] [DRY RUN]   -- garbage collection
//! ```
//!
//! DataFusion's parser knows none of these; they are recognised by their
//! leading words and parsed here. RESTORE commits one version whose tables
//! equal the target's (docs/lifecycle.md).

use crate::session::EngineError;
use crate::time_travel::{AsOf, parse_timestamp_ms};

/// A history statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum History {
    CreateSnapshot { name: String, at: Option<AsOf> },
    DropSnapshot { name: String, if_exists: bool },
    ShowSnapshots,
    /// Bytes by table, pinned by snapshot, and awaiting VACUUM.
    ShowStorage,
    ShowVersions { limit: usize },
    /// `tables`: `None` for the whole database.
    Restore { tables: Option<Vec<String>>, to: AsOf },
    Vacuum { retain: std::time::Duration, grace: std::time::Duration, dry_run: bool },
}

/// Default of `SHOW VERSIONS`.
const SHOW_VERSIONS_DEFAULT: usize = 100;

/// Parses `sql` if it is a history statement; `Ok(None)` for anything else.
pub(crate) fn parse(sql: &str) -> Result<Option<History>, EngineError> {
    let text = sql.trim().trim_end_matches(';').trim();
    let words: Vec<&str> = text.split_whitespace().collect();
    let kw = |i: usize, w: &str| words.get(i).is_some_and(|x| x.eq_ignore_ascii_case(w));
    let bad = |m: String| EngineError::Unsupported(m);
    if kw(0, "CREATE") && kw(1, "SNAPSHOT") {
        let rest = words.get(2..).unwrap_or_default().join(" ");
        let (name, at) = match rest.split_once(char::is_whitespace) {
            None => (rest.clone(), None),
            Some((name, clause)) => {
                let probe = format!("SELECT * FROM t {clause}");
                let Some((_, mut found)) = crate::time_travel::rewrite(&probe)? else {
                    return Err(bad(format!("CREATE SNAPSHOT {name} {clause}: expected AT(VERSION => n), AT(TIMESTAMP => '…') or AT(SNAPSHOT => 'name')")));
                };
                (name.to_string(), Some(found.remove(0)))
            }
        };
        return Ok(Some(History::CreateSnapshot { name: identifier(&name)?, at }));
    }
    if kw(0, "DROP") && kw(1, "SNAPSHOT") {
        let (if_exists, name) = if kw(2, "IF") && kw(3, "EXISTS") { (true, words.get(4)) } else { (false, words.get(2)) };
        let name = name.ok_or_else(|| bad("DROP SNAPSHOT needs a name".into()))?;
        if words.len() > if if_exists { 5 } else { 3 } {
            return Err(bad(format!("DROP SNAPSHOT takes one name, not '{text}'")));
        }
        return Ok(Some(History::DropSnapshot { name: identifier(name)?, if_exists }));
    }
    if kw(0, "SHOW") && kw(1, "STORAGE") && words.len() == 2 {
        return Ok(Some(History::ShowStorage));
    }
    if kw(0, "SHOW") && kw(1, "SNAPSHOTS") && words.len() == 2 {
        return Ok(Some(History::ShowSnapshots));
    }
    if kw(0, "SHOW") && kw(1, "VERSIONS") {
        let limit = match words.get(2) {
            None => SHOW_VERSIONS_DEFAULT,
            Some(n) => n.parse().map_err(|_| bad(format!("SHOW VERSIONS [n]: '{n}' is not a number")))?,
        };
        return Ok(Some(History::ShowVersions { limit }));
    }
    if kw(0, "VACUUM") {
        let mut rest = &words[1..];
        let mut dry_run = false;
        if rest.len() >= 2 && rest[rest.len() - 2].eq_ignore_ascii_case("DRY") && rest[rest.len() - 1].eq_ignore_ascii_case("RUN") {
            dry_run = true;
            rest = &rest[..rest.len() - 2];
        }
        // RETAIN '…' and GRACE '…', each optional, in either order.
        let (mut retain, mut grace) = (blobhouse_storage::gc::DEFAULT_RETAIN, blobhouse_storage::gc::DEFAULT_GRACE);
        let joined = rest.join(" ");
        let mut tail = joined.trim();
        while !tail.is_empty() {
            let (word, after) = tail.split_once(char::is_whitespace).ok_or_else(|| bad(format!("VACUUM [RETAIN '7 days'] [GRACE '1 day'] [DRY RUN], not '{text}'")))?;
            let after = after.trim_start();
            let (interval, next) = match after.strip_prefix('\'') {
                Some(q) => q.split_once('\'').map(|(i, n)| (i.to_string(), n.trim_start())).ok_or_else(|| bad(format!("VACUUM: unclosed quote in '{text}'")))?,
                None => after.split_once(char::is_whitespace).map_or((after.to_string(), ""), |(i, n)| (i.to_string(), n.trim_start())),
            };
            let value = blobhouse_storage::gc::parse_interval(&interval).map_err(|e| bad(format!("VACUUM {word}: {e}")))?;
            match word.to_ascii_uppercase().as_str() {
                "RETAIN" => retain = value,
                "GRACE" => grace = value,
                _ => return Err(bad(format!("VACUUM [RETAIN '7 days'] [GRACE '1 day'] [DRY RUN], not '{text}'"))),
            }
            tail = next;
        }
        return Ok(Some(History::Vacuum { retain, grace, dry_run }));
    }
    if kw(0, "RESTORE") {
        let to = words.iter().position(|w| w.eq_ignore_ascii_case("TO")).ok_or_else(|| bad("RESTORE DATABASE | TABLE t TO VERSION n | TIMESTAMP '…' | SNAPSHOT name".into()))?;
        let tables = if kw(1, "DATABASE") && to == 2 {
            None
        } else if kw(1, "TABLE") && to > 2 {
            let list = words[2..to].join(" ");
            Some(list.split(',').map(|t| identifier(t.trim())).collect::<Result<Vec<_>, _>>()?)
        } else {
            return Err(bad("RESTORE DATABASE TO … or RESTORE TABLE t [, u] TO …".into()));
        };
        let target = words[to + 1..].join(" ");
        let (kind, value) = target.split_once(char::is_whitespace).ok_or_else(|| bad(format!("RESTORE … TO {target}: say VERSION n, TIMESTAMP '…' or SNAPSHOT name")))?;
        let value = value.trim();
        let to = match kind.to_ascii_uppercase().as_str() {
            "VERSION" => AsOf::Version(value.parse().map_err(|_| bad(format!("'{value}' is not a version number")))?),
            "TIMESTAMP" => AsOf::Timestamp(parse_timestamp_ms(value.trim_matches('\'')).map_err(bad)?),
            "SNAPSHOT" => AsOf::Snapshot(identifier(value)?),
            other => return Err(bad(format!("RESTORE … TO {other}: say VERSION, TIMESTAMP or SNAPSHOT"))),
        };
        return Ok(Some(History::Restore { tables, to }));
    }
    Ok(None)
}

/// A name: quoted as written, else lower-cased (as SQL identifiers are).
fn identifier(s: &str) -> Result<String, EngineError> {
    let s = s.trim();
    if let Some(inner) = s.strip_prefix('"').and_then(|x| x.strip_suffix('"')).or_else(|| s.strip_prefix('\'').and_then(|x| x.strip_suffix('\''))) {
        return Ok(inner.to_string());
    }
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(EngineError::Unsupported(format!("'{s}' is not a name; quote it (\"…\") if it has other characters")));
    }
    Ok(s.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(parse("CREATE SNAPSHOT Nightly").unwrap(), Some(History::CreateSnapshot { name: "nightly".into(), at: None }));
        assert_eq!(parse("create snapshot s AT(VERSION => 7);").unwrap(), Some(History::CreateSnapshot { name: "s".into(), at: Some(AsOf::Version(7)) }));
        assert_eq!(parse("DROP SNAPSHOT IF EXISTS s").unwrap(), Some(History::DropSnapshot { name: "s".into(), if_exists: true }));
        assert_eq!(parse("SHOW VERSIONS 5").unwrap(), Some(History::ShowVersions { limit: 5 }));
        assert_eq!(parse("SHOW SNAPSHOTS").unwrap(), Some(History::ShowSnapshots));
        assert_eq!(parse("show storage;").unwrap(), Some(History::ShowStorage));
        assert_eq!(parse("RESTORE DATABASE TO SNAPSHOT s").unwrap(), Some(History::Restore { tables: None, to: AsOf::Snapshot("s".into()) }));
        assert_eq!(
            parse("RESTORE TABLE a, b TO VERSION 12").unwrap(),
            Some(History::Restore { tables: Some(vec!["a".into(), "b".into()]), to: AsOf::Version(12) })
        );
        assert!(matches!(parse("RESTORE TABLE t TO TIMESTAMP '2026-11-23 00:00:01'").unwrap(), Some(History::Restore { to: AsOf::Timestamp(1_795_392_001_000), .. })));
        let day = std::time::Duration::from_secs(86400);
        assert_eq!(parse("VACUUM").unwrap(), Some(History::Vacuum { retain: 7 * day, grace: day, dry_run: false }));
        assert_eq!(parse("vacuum retain '0 seconds' dry run").unwrap(), Some(History::Vacuum { retain: std::time::Duration::ZERO, grace: day, dry_run: true }));
        assert_eq!(parse("VACUUM GRACE 0s RETAIN '2 days'").unwrap(), Some(History::Vacuum { retain: 2 * day, grace: std::time::Duration::ZERO, dry_run: false }));
        assert!(parse("VACUUM t").is_err());
        assert!(parse("SELECT 1").unwrap().is_none());
        assert!(parse("RESTORE DATABASE TO YESTERDAY").is_err());
    }
}
