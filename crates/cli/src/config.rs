//! `blobhouse serve --config FILE`: the server's settings in one TOML file.
//!
//! Every key is one of serve's flags (`pg-listen`, `memory-limit`, …; `_`
//! may stand for `-`), so the file and `--help` document the same settings
//! and clap checks both the same way. A `[users]` table gives SCRAM hashes
//! (`name = "scram-sha-256$…"`, from `blobhouse hash-password`), never
//! passwords. Flags on the command line win over the file.
//!
//! ```toml
//! db = "s3://bucket/db"
//! pg-listen = "0.0.0.0:5432"
//! tls-cert = "/etc/blobhouse/server.crt"
//! tls-key = "/etc/blobhouse/server.key"
//! memory-limit = "16G"
//!
//! [users]
//! alice = "scram-sha-256$4096$…"
//! ```

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};

/// What a config file adds to `serve`'s command line.
#[derive(Debug, Default)]
pub struct ServeConfig {
    /// The file.
    pub path: std::path::PathBuf,
    /// Flags in the file, as command-line words (`--pg-listen`, `0.0.0.0:5432`).
    pub args: Vec<OsString>,
    /// `[users]`: (name, SCRAM hash, line in the file).
    pub users: Vec<(String, String, usize)>,
}

/// Reads `path`. `flags` are serve's long flags and whether each takes a
/// value: a key that is none of them is refused by name, with the line.
pub fn load(path: &Path, flags: &[(String, bool)]) -> Result<ServeConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the config file {}", path.display()))?;
    let config = parse(&text, flags).with_context(|| format!("config file {}", path.display()))?;
    Ok(ServeConfig { path: path.to_path_buf(), ..config })
}

fn parse(text: &str, flags: &[(String, bool)]) -> Result<ServeConfig> {
    let doc = toml_edit::Document::parse(text).map_err(|e| anyhow!("{}", e.to_string().trim_end()))?;
    let line = |span: Option<std::ops::Range<usize>>| span.map_or(0, |s| text[..s.start].lines().count().max(1));
    let mut config = ServeConfig::default();
    for (key, item) in doc.as_table().iter() {
        let at = line(item.span().or_else(|| doc.as_table().key(key).and_then(|k| k.span())));
        if key == "users" {
            let users = item.as_table_like().ok_or_else(|| anyhow!("line {at}: users must be a table: [users] with a line name = \"scram-sha-256$…\" per user"))?;
            for (name, hash) in users.iter() {
                let at = line(hash.span());
                let hash = hash.as_str().ok_or_else(|| anyhow!("line {at}: user {name}: the value must be a quoted SCRAM hash (blobhouse hash-password prints one)"))?;
                config.users.push((name.to_string(), hash.to_string(), at));
            }
            continue;
        }
        let flag = key.replace('_', "-");
        let Some((_, takes_value)) = flags.iter().find(|(f, _)| *f == flag && f != "config") else {
            let known: Vec<&str> = flags.iter().map(|(f, _)| f.as_str()).filter(|f| *f != "config").collect();
            bail!("line {at}: unknown setting '{key}'; the settings are serve's flags ({}) and [users]", known.join(", "));
        };
        let value = match (item.as_str(), item.as_integer(), item.as_bool(), item.as_float()) {
            (Some(s), ..) => Some(s.to_string()),
            (_, Some(i), ..) => Some(i.to_string()),
            (_, _, Some(b), _) if !takes_value => {
                if b {
                    config.args.push(format!("--{flag}").into());
                }
                continue;
            }
            (_, _, _, Some(f)) => Some(f.to_string()),
            _ => None,
        };
        match (value, takes_value) {
            (Some(v), true) => {
                config.args.push(format!("--{flag}").into());
                config.args.push(v.into());
            }
            (_, false) => bail!("line {at}: {key} is a switch: write {key} = true or false"),
            (None, true) => bail!("line {at}: {key} takes a string or a number, not a {}", item.type_name()),
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Vec<(String, bool)> {
        vec![("pg-listen".into(), true), ("max-connections".into(), true), ("allow-http".into(), false), ("config".into(), true)]
    }

    #[test]
    fn keys_become_flags_and_users_hashes() {
        let c = parse("pg_listen = \"0.0.0.0:5432\"\nmax-connections = 8\nallow-http = true\n\n[users]\nalice = \"scram-sha-256$x\"\n", &flags()).unwrap();
        let args: Vec<String> = c.args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["--pg-listen", "0.0.0.0:5432", "--max-connections", "8", "--allow-http"]);
        assert_eq!(c.users, vec![("alice".to_string(), "scram-sha-256$x".to_string(), 6)]);
    }

    #[test]
    fn mistakes_are_named_with_their_line() {
        let err = |text: &str| format!("{:#}", parse(text, &flags()).unwrap_err());
        assert!(err("max-connections = 8\npg-lisen = \"x\"\n").contains("line 2: unknown setting 'pg-lisen'"));
        assert!(err("config = \"other.toml\"\n").contains("unknown setting 'config'"));
        assert!(err("allow-http = \"yes\"\n").contains("line 1: allow-http is a switch"));
        assert!(err("pg-listen = [1]\n").contains("takes a string or a number"));
        assert!(err("[users]\nalice = 3\n").contains("line 2: user alice"));
        assert!(err("pg-listen = \n").contains("line 1"));
    }
}
