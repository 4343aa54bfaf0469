//! Scripts cut into statements: what the shell and `execute_script` feed
//! to the parser one statement at a time. This is lexical only — quotes
//! and comments, where a `;` ends nothing — and decides nothing about what
//! a statement is; [`crate::parser`] does that.

/// and comments. Empty statements are dropped; a last statement without its
/// `;` is kept.
pub fn split_statements(sql: &str) -> Vec<String> {
    let (mut out, rest) = split_complete_statements(sql);
    if !rest.trim().is_empty() {
        out.extend(split_complete_statements(&format!("{rest};")).0);
    }
    out
}

/// The statements of `sql` that its `;`s end, and the text after the last
/// of them as written: what a shell keeps reading lines into until the
/// statement is complete (a `;` inside a quote or comment ends nothing).
pub fn split_complete_statements(sql: &str) -> (Vec<String>, &str) {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut rest_from = 0;
    let mut chars = sql.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        match c {
            '\'' | '"' => {
                cur.push(c);
                while let Some((_, d)) = chars.next() {
                    cur.push(d);
                    if d == c {
                        if chars.peek().map(|p| p.1) == Some(c) {
                            cur.push(chars.next().expect("peeked").1);
                        } else {
                            break;
                        }
                    }
                }
            }
            '-' if chars.peek().map(|p| p.1) == Some('-') => {
                for (_, d) in chars.by_ref() {
                    if d == '\n' {
                        cur.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek().map(|p| p.1) == Some('*') => {
                chars.next();
                let mut prev = ' ';
                for (_, d) in chars.by_ref() {
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
                cur.push(' ');
            }
            ';' => {
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_string());
                }
                cur.clear();
                rest_from = chars.peek().map_or(sql.len(), |p| p.0);
            }
            _ => cur.push(c),
        }
    }
    (out, &sql[rest_from..])
}

#[cfg(test)]
mod tests {
    use super::split_statements;

    #[test]
    fn splits_scripts_outside_quotes_and_comments() {
        let s = split_statements("select ';' as a; -- c;\n select 2 /* ; */;;\n insert into t values ('it''s;')");
        assert_eq!(s, vec!["select ';' as a", "select 2", "insert into t values ('it''s;')"]);
    }

    #[test]
    fn keeps_an_unfinished_statement_as_written() {
        let (done, rest) = super::split_complete_statements("select 1; select 'a;\nb' /* ; */; select /* x;");
        assert_eq!(done, vec!["select 1", "select 'a;\nb'"]);
        assert_eq!(rest, " select /* x;");
        let (done, rest) = super::split_complete_statements("select 'it;");
        assert!(done.is_empty());
        assert_eq!(rest, "select 'it;");
        assert_eq!(super::split_complete_statements("select 2;\n").1, "\n");
    }
}
