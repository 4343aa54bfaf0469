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
    /// Said once at start: the file holds secrets and others may read it.
    pub warning: Option<String>,
}

/// Settings whose values are secrets (besides `[users]`' hashes).
const SECRET_FLAGS: [&str; 1] = ["--secret-access-key"];

/// Reads `path`. `flags` are serve's long flags and whether each takes a
/// value: a key that is none of them is refused by name, with the line.
pub fn load(path: &Path, flags: &[(String, bool)]) -> Result<ServeConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the config file {}", path.display()))?;
    let config = parse(&text, flags).with_context(|| format!("config file {}", path.display()))?;
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).map(|m| m.permissions().mode()).unwrap_or(0)
    };
    let warning = secrets_warning(path, mode, &config);
    Ok(ServeConfig { path: path.to_path_buf(), warning, ..config })
}

/// A warning when `config` (read from `path`, of permission bits `mode`)
/// holds secrets — SCRAM hashes, with which a password can be guessed
/// offline, or a store's secret key — and its group or others may read it.
fn secrets_warning(path: &Path, mode: u32, config: &ServeConfig) -> Option<String> {
    let mut secrets: Vec<&str> = Vec::new();
    if !config.users.is_empty() {
        secrets.push("[users]' password hashes");
    }
    secrets.extend(SECRET_FLAGS.iter().filter(|f| config.args.iter().any(|a| a == **f)).map(|f| f.trim_start_matches('-')));
    if secrets.is_empty() || mode & 0o044 == 0 {
        return None;
    }
    Some(format!(
        "the config file {} holds secrets ({}) and others may read it (mode {:o}): chmod 600 {}",
        path.display(),
        secrets.join(", "),
        mode & 0o777,
        path.display()
    ))
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
        // A repeatable flag (`allow-files = ["s3://lake/", "/srv/"]`): once per value.
        if let Some(values) = item.as_array().filter(|a| *takes_value && a.iter().all(|v| v.as_str().is_some())) {
            for v in values.iter().filter_map(|v| v.as_str()) {
                config.args.push(format!("--{flag}").into());
                config.args.push(v.into());
            }
            continue;
        }
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
        vec![("pg-listen".into(), true), ("max-connections".into(), true), ("allow-http".into(), false), ("allow-files".into(), true), ("config".into(), true)]
    }

    #[test]
    fn a_list_repeats_its_flag() {
        let c = parse("allow_files = [\"s3://lake/\", \"/srv/\"]\n", &flags()).unwrap();
        let args: Vec<String> = c.args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["--allow-files", "s3://lake/", "--allow-files", "/srv/"]);
        assert!(parse("allow_files = [1]\n", &flags()).unwrap_err().to_string().contains("takes a string or a number"));
    }

    #[test]
    fn keys_become_flags_and_users_hashes() {
        let c = parse("pg_listen = \"0.0.0.0:5432\"\nmax-connections = 8\nallow-http = true\n\n[users]\nalice = \"scram-sha-256$x\"\n", &flags()).unwrap();
        let args: Vec<String> = c.args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["--pg-listen", "0.0.0.0:5432", "--max-connections", "8", "--allow-http"]);
        assert_eq!(c.users, vec![("alice".to_string(), "scram-sha-256$x".to_string(), 6)]);
    }

    #[test]
    fn a_file_with_secrets_that_others_may_read_is_named() {
        let path = Path::new("/etc/blobhouse.toml");
        let with_users = parse("[users]\nalice = \"scram-sha-256$x\"\n", &flags()).unwrap();
        let warning = secrets_warning(path, 0o100644, &with_users).expect("a warning");
        assert!(warning.contains("/etc/blobhouse.toml") && warning.contains("mode 644") && warning.contains("chmod 600"), "{warning}");
        assert_eq!(secrets_warning(path, 0o100600, &with_users), None, "only its owner may read it");
        let no_secrets = parse("pg-listen = \"127.0.0.1:5432\"\n", &flags()).unwrap();
        assert_eq!(secrets_warning(path, 0o100644, &no_secrets), None, "nothing secret in it");
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
