//! blobhouse's own statements, parsed on the statement's token stream
//! with sqlparser's primitives (so errors say line and column):
//!
//! ```sql
//! CREATE SNAPSHOT name [AT(VERSION => n) | AT(TIMESTAMP => '…') | AT(SNAPSHOT => 'name')]
//! DROP SNAPSHOT [IF EXISTS] name
//! SHOW SNAPSHOTS | SHOW STORAGE | SHOW VERSIONS [n] | SHOW CACHE
//! RESTORE DATABASE TO VERSION n | TIMESTAMP '…' | SNAPSHOT name
//! RESTORE TABLE t [, u …] TO VERSION n | TIMESTAMP '…' | SNAPSHOT name
//! VACUUM [RETAIN '7 days'] [GRACE '1 day'] [DRY RUN]
//! OPTIMIZE [TABLE] t
//! ALTER DATABASE SET iceberg = on | off | v2 | v3
//! ```
//!
//! sqlparser knows none of these (its VACUUM and OPTIMIZE are other
//! databases' statements); a statement that starts otherwise is left
//! untouched for DataFusion's parser.

use datafusion::sql::sqlparser::ast::Ident;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, Word};

use super::{Statement, error_at};
use crate::history::History;
use crate::time_travel::{self, AsOf};

/// Default of `SHOW VERSIONS`.
const SHOW_VERSIONS_DEFAULT: usize = 100;

/// Parses one of blobhouse's statements; `None` (nothing consumed) for any
/// other statement.
pub(super) fn parse(p: &mut Parser) -> Result<Option<Statement>, ParserError> {
    let history = |h| Ok(Some(Statement::History(h)));
    if word_at(p, 0, "CREATE") && word_at(p, 1, "SNAPSHOT") {
        p.next_token();
        p.next_token();
        let name = name(p)?;
        let at = match p.maybe_parse_table_version()? {
            Some(v) => Some(time_travel::as_of(&v).map_err(|m| error_at(m, p.peek_token().span.start))?),
            None => None,
        };
        return history(History::CreateSnapshot { name, at });
    }
    if word_at(p, 0, "DROP") && word_at(p, 1, "SNAPSHOT") {
        p.next_token();
        p.next_token();
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        return history(History::DropSnapshot { name: name(p)?, if_exists });
    }
    if word_at(p, 0, "SHOW") {
        let what = if word_at(p, 1, "SNAPSHOTS") {
            Some(Statement::History(History::ShowSnapshots))
        } else if word_at(p, 1, "STORAGE") {
            Some(Statement::History(History::ShowStorage))
        } else if word_at(p, 1, "CACHE") {
            Some(Statement::ShowCache)
        } else if word_at(p, 1, "VERSIONS") {
            p.next_token();
            p.next_token();
            let limit = match p.peek_token().token {
                Token::EOF | Token::SemiColon => SHOW_VERSIONS_DEFAULT,
                _ => usize::try_from(p.parse_literal_uint()?).unwrap_or(usize::MAX),
            };
            return history(History::ShowVersions { limit });
        } else {
            None
        };
        if what.is_some() {
            p.next_token();
            p.next_token();
        }
        return Ok(what);
    }
    if word_at(p, 0, "VACUUM") {
        p.next_token();
        return history(vacuum(p)?);
    }
    if word_at(p, 0, "RESTORE") {
        p.next_token();
        return history(restore(p)?);
    }
    if word_at(p, 0, "ALTER") && word_at(p, 1, "DATABASE") {
        p.next_token();
        p.next_token();
        p.expect_keyword(Keyword::SET)?;
        let at = p.peek_token();
        let setting = p.parse_identifier()?;
        if !setting.value.eq_ignore_ascii_case("iceberg") {
            return Err(error_at(format!("ALTER DATABASE SET knows one setting, iceberg (on or off), not '{}'", setting.value), at.span.start));
        }
        if !p.consume_token(&Token::Eq) {
            let _ = p.parse_keyword(Keyword::TO);
        }
        let value = p.peek_token();
        let said = match &value.token {
            Token::Word(w) => w.value.to_ascii_lowercase(),
            Token::SingleQuotedString(v) => v.to_ascii_lowercase(),
            _ => String::new(),
        };
        let (on, format) = match said.as_str() {
            "on" | "true" => (true, None),
            "off" | "false" => (false, None),
            "v2" => (true, Some(2)),
            "v3" => (true, Some(3)),
            _ => return Err(error_at(format!("Expected: on, off, v2 or v3 for iceberg, found: {}", value.token), value.span.start)),
        };
        p.next_token();
        return history(History::SetIceberg { on, format });
    }
    if word_at(p, 0, "OPTIMIZE") {
        p.next_token();
        let _ = p.parse_keyword(Keyword::TABLE);
        return Ok(Some(Statement::Optimize { table: name(p)? }));
    }
    Ok(None)
}

/// `VACUUM [RETAIN '…'] [GRACE '…'] [DRY RUN]`, after VACUUM.
fn vacuum(p: &mut Parser) -> Result<History, ParserError> {
    let (mut retain, mut grace) = (blobhouse_storage::gc::DEFAULT_RETAIN, blobhouse_storage::gc::DEFAULT_GRACE);
    let mut dry_run = false;
    loop {
        let at = p.peek_token();
        if word_at(p, 0, "RETAIN") || word_at(p, 0, "GRACE") {
            let retaining = word_at(p, 0, "RETAIN");
            p.next_token();
            let value = p.peek_token();
            let text = match &value.token {
                Token::SingleQuotedString(s) => s.clone(),
                // `GRACE 0s`: a number and a unit written together.
                Token::Number(n, _) => match p.peek_nth_token(1).token {
                    Token::Word(w) if value.span.end == p.peek_nth_token(1).span.start => {
                        p.next_token();
                        format!("{n}{}", w.value)
                    }
                    _ => n.clone(),
                },
                Token::Word(w) => w.value.clone(),
                _ => return p.expected("an interval such as '7 days'", value),
            };
            p.next_token();
            let duration = blobhouse_storage::gc::parse_interval(&text).map_err(|e| error_at(format!("VACUUM {}: {e}", if retaining { "RETAIN" } else { "GRACE" }), value.span.start))?;
            if retaining {
                retain = duration;
            } else {
                grace = duration;
            }
        } else if word_at(p, 0, "DRY") && word_at(p, 1, "RUN") {
            p.next_token();
            p.next_token();
            dry_run = true;
        } else if matches!(at.token, Token::EOF | Token::SemiColon) {
            return Ok(History::Vacuum { retain, grace, dry_run });
        } else {
            return p.expected("RETAIN '…', GRACE '…', DRY RUN or the end of VACUUM", at);
        }
    }
}

/// `RESTORE DATABASE | TABLE t [, u] TO …`, after RESTORE.
fn restore(p: &mut Parser) -> Result<History, ParserError> {
    let tables = if p.parse_keyword(Keyword::DATABASE) {
        None
    } else if p.parse_keyword(Keyword::TABLE) {
        Some(p.parse_comma_separated(name)?)
    } else {
        return p.expected("DATABASE or TABLE after RESTORE", p.peek_token());
    };
    p.expect_keyword_is(Keyword::TO)?;
    let kind = p.peek_token();
    let to = if word_at(p, 0, "VERSION") {
        p.next_token();
        AsOf::Version(p.parse_literal_uint()?)
    } else if word_at(p, 0, "TIMESTAMP") {
        p.next_token();
        let value = p.peek_token();
        let text = p.parse_literal_string()?;
        AsOf::Timestamp(time_travel::parse_timestamp_ms(&text).map_err(|m| error_at(m, value.span.start))?)
    } else if word_at(p, 0, "SNAPSHOT") {
        p.next_token();
        AsOf::Snapshot(name(p)?)
    } else {
        return p.expected("VERSION, TIMESTAMP or SNAPSHOT after RESTORE … TO", kind);
    };
    Ok(History::Restore { tables, to })
}

/// A name: quoted as written (double or single quotes), else lower-cased
/// as SQL identifiers are.
fn name(p: &mut Parser) -> Result<String, ParserError> {
    if let Token::SingleQuotedString(s) = p.peek_token().token {
        p.next_token();
        return Ok(s);
    }
    let ident: Ident = p.parse_identifier()?;
    Ok(if ident.quote_style.is_some() { ident.value } else { ident.value.to_lowercase() })
}

/// Whether the `n`th token ahead is the unquoted word `w`.
fn word_at(p: &Parser, n: usize, w: &str) -> bool {
    matches!(p.peek_nth_token(n).token, Token::Word(Word { ref value, quote_style: None, .. }) if value.eq_ignore_ascii_case(w))
}

#[cfg(test)]
mod tests {
    use super::super::parse as parse_sql;
    use super::*;

    fn history(sql: &str) -> History {
        match parse_sql(sql, "generic", 50).unwrap_or_else(|e| panic!("{sql}: {e}")).statement {
            Statement::History(h) => h,
            other => panic!("{sql}: {other:?}"),
        }
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(history("CREATE SNAPSHOT Nightly"), History::CreateSnapshot { name: "nightly".into(), at: None });
        assert_eq!(history("create snapshot s AT(VERSION => 7);"), History::CreateSnapshot { name: "s".into(), at: Some(AsOf::Version(7)) });
        assert_eq!(history("DROP SNAPSHOT IF EXISTS s"), History::DropSnapshot { name: "s".into(), if_exists: true });
        assert_eq!(history("SHOW VERSIONS 5"), History::ShowVersions { limit: 5 });
        assert_eq!(history("SHOW VERSIONS"), History::ShowVersions { limit: SHOW_VERSIONS_DEFAULT });
        assert_eq!(history("SHOW SNAPSHOTS"), History::ShowSnapshots);
        assert_eq!(history("show storage;"), History::ShowStorage);
        assert_eq!(history("RESTORE DATABASE TO SNAPSHOT s"), History::Restore { tables: None, to: AsOf::Snapshot("s".into()) });
        assert_eq!(history("RESTORE TABLE a, \"B\" TO VERSION 12"), History::Restore { tables: Some(vec!["a".into(), "B".into()]), to: AsOf::Version(12) });
        assert!(matches!(history("RESTORE TABLE t TO TIMESTAMP '2026-11-23 00:00:01'"), History::Restore { to: AsOf::Timestamp(1_795_392_001_000), .. }));
        let day = std::time::Duration::from_secs(86400);
        assert_eq!(history("VACUUM"), History::Vacuum { retain: 7 * day, grace: day, dry_run: false });
        assert_eq!(history("vacuum retain '0 seconds' dry run"), History::Vacuum { retain: std::time::Duration::ZERO, grace: day, dry_run: true });
        assert_eq!(history("VACUUM GRACE 0s RETAIN '2 days'"), History::Vacuum { retain: 2 * day, grace: std::time::Duration::ZERO, dry_run: false });
        for bad in ["VACUUM t", "RESTORE DATABASE TO YESTERDAY", "DROP SNAPSHOT", "CREATE SNAPSHOT s AT(OFFSET => 1)"] {
            assert!(parse_sql(bad, "generic", 50).is_err(), "{bad}");
        }
    }
}
