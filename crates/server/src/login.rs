//! A PostgreSQL connection's startup: TLS required when configured, SCRAM,
//! the startup parameters, and the mark that the connection logged in.
//!
//! pgwire runs the startup exchange; this module decides what it may
//! accept. Three things pgwire alone gets wrong for a database server:
//! - after a failed login it answers ReadyForQuery and keeps reading, so a
//!   client that ignores the FATAL could send statements. Statements run
//!   only on a connection carrying [`LoggedIn`], which is set here and only
//!   once SCRAM has succeeded;
//! - an unknown user and a wrong password failed at different steps with
//!   different words (and the latter without the user's name), telling a
//!   caller which names exist. Unknown users now go through the whole
//!   exchange against a mock secret, and every failure reads
//!   `password authentication failed for user "…"` and is logged once;
//! - startup parameters (`application_name`, `DateStyle`, `options=-c …`)
//!   were kept but never applied or checked; they now become the
//!   connection's [`Settings`], and a value blobhouse cannot honour
//!   refuses the connection with the reason.

use std::collections::HashMap;
use std::fmt::Debug;

use async_trait::async_trait;
use futures::Sink;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{ServerParameterProvider, StartupHandler};
use pgwire::api::{ClientInfo, PgWireConnectionState};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::startup::PasswordMessageFamily;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use blobhouse_engine::settings::Values as Settings;

/// Set on a connection once its login succeeded, with the parameters its
/// startup asked for; a connection without it runs no statement.
pub(crate) struct LoggedIn {
    pub(crate) user: String,
    pub(crate) settings: Settings,
}

/// The connection's parameters from its startup message: every key but
/// the user, database and replication ones; libpq's `options` (`-c
/// name=value`, `--name=value`) each on its own.
pub(crate) fn startup_settings(metadata: &HashMap<String, String>) -> Result<Settings, ErrorInfo> {
    let user = metadata.get(pgwire::api::METADATA_USER).cloned().unwrap_or_default();
    let mut settings = Settings::for_user(&user);
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (key, value) in metadata {
        match key.as_str() {
            "user" | "database" | "replication" => {}
            "options" => pairs.extend(options(value)),
            _ => pairs.push((key.clone(), value.clone())),
        }
    }
    pairs.sort();
    for (name, value) in pairs {
        if let Err(e) = settings.startup(&name, &value) {
            return Err(ErrorInfo::new("FATAL".into(), e.sqlstate().into(), format!("{e} (in the connection's startup parameters)")));
        }
    }
    Ok(settings)
}

/// `-c a=1 --b=2` as (a, 1), (b, 2).
fn options(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut words = text.split_whitespace();
    while let Some(word) = words.next() {
        let pair = match word {
            "-c" => words.next(),
            w => w.strip_prefix("--").or_else(|| w.strip_prefix("-c")),
        };
        if let Some((k, v)) = pair.and_then(|p| p.split_once('=')) {
            out.push((k.replace('-', "_"), v.to_string()));
        }
    }
    out
}

/// The ParameterStatus messages after login: PostgreSQL's reported
/// parameters with the connection's values.
pub(crate) struct Parameters {
    pub(crate) scram_iterations: usize,
}

impl ServerParameterProvider for Parameters {
    fn server_parameters<C>(&self, client: &C) -> Option<HashMap<String, String>>
    where
        C: ClientInfo,
    {
        let settings = startup_settings(client.metadata()).unwrap_or_else(|_| Settings::for_user(client.metadata().get(pgwire::api::METADATA_USER).map_or("", String::as_str)));
        let mut out: HashMap<String, String> = settings.reported().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        out.insert("server_version".into(), format!("16.0 (blobhouse {})", env!("CARGO_PKG_VERSION")));
        out.insert("in_hot_standby".into(), "off".into());
        out.insert("scram_iterations".into(), self.scram_iterations.to_string());
        Some(out)
    }
}

/// SCRAM authentication, behind a TLS check; marks the connection
/// [`LoggedIn`] when it succeeds.
///
/// pgwire serves a client that skips the SSLRequest in plaintext even when
/// it has a TLS acceptor; a server told to use TLS must not, so the first
/// startup message of a plaintext connection is answered with a FATAL
/// error (the connection closes before any password is exchanged).
pub(crate) struct Startup {
    pub(crate) sasl: SASLAuthStartupHandler<Parameters>,
    pub(crate) require_tls: bool,
    /// Whether the connection's SASLInitialResponse has come (its first
    /// password message; later ones are SASL responses).
    pub(crate) initial_seen: std::sync::atomic::AtomicBool,
}

/// Whether a SASLInitialResponse body is what PostgreSQL's protocol says:
/// a mechanism name ending in NUL, then a length (-1, or at most the bytes
/// that follow) and the data. pgwire 0.41 decodes it without checking and
/// panics on a short one (found by `server_fuzz`), so it is checked here.
pub(crate) fn sasl_initial_is_well_formed(body: &[u8]) -> bool {
    let Some(nul) = body.iter().position(|b| *b == 0) else { return false };
    let rest = &body[nul + 1..];
    let Some(length) = rest.get(..4) else { return false };
    let length = i32::from_be_bytes([length[0], length[1], length[2], length[3]]);
    length == -1 || usize::try_from(length).is_ok_and(|n| n <= rest.len() - 4)
}

/// The user name of the connection's startup message.
fn user_of<C: ClientInfo>(client: &C) -> String {
    client.metadata().get(pgwire::api::METADATA_USER).cloned().unwrap_or_default()
}

fn fatal(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("FATAL".into(), code.into(), message)))
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if self.require_tls && !client.is_secure() {
            return Err(fatal("28000", "this server accepts TLS connections only: connect with sslmode=require (or verify-full)".into()));
        }
        if let PgWireFrontendMessage::PasswordMessageFamily(PasswordMessageFamily::Raw(body)) = &message
            && !self.initial_seen.swap(true, std::sync::atomic::Ordering::Relaxed)
            && !sasl_initial_is_well_formed(body)
        {
            return Err(fatal("08P01", "malformed SASLInitialResponse message".into()));
        }
        let is_startup = matches!(message, PgWireFrontendMessage::Startup(_));
        match self.sasl.on_startup(client, message).await {
            Ok(()) => {}
            Err(PgWireError::InvalidPassword(_)) => {
                // The user name of the startup message (SCRAM's own is
                // empty with libpq), the same words for every failure.
                let user = user_of(client);
                tracing::info!(user = %user, peer = %client.socket_addr(), protocol = "postgres", "login refused");
                return Err(fatal("28P01", format!("password authentication failed for user \"{user}\"")));
            }
            Err(e) => {
                tracing::info!(user = %user_of(client), peer = %client.socket_addr(), protocol = "postgres", error = %e, "login refused");
                return Err(e);
            }
        }
        if is_startup {
            // Parameters the connection cannot have refuse it before any
            // password is exchanged, with the reason.
            startup_settings(client.metadata()).map_err(|info| PgWireError::UserError(Box::new(info)))?;
        }
        if matches!(client.state(), PgWireConnectionState::ReadyForQuery) && client.session_extensions().get::<LoggedIn>().is_none() {
            let settings = startup_settings(client.metadata()).map_err(|info| PgWireError::UserError(Box::new(info)))?;
            client.session_extensions().insert(LoggedIn { user: user_of(client), settings });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_sasl_initial_responses_are_refused_before_pgwire_decodes_them() {
        assert!(sasl_initial_is_well_formed(b"SCRAM-SHA-256\0\0\0\0\x03abc"));
        assert!(sasl_initial_is_well_formed(b"SCRAM-SHA-256\0\xff\xff\xff\xff"));
        for bad in [&b""[..], b"SCRAM-SHA-256", b"SCRAM-SHA-256\0\0\0", b"SCRAM-SHA-256\0\0\0\0\x09abc", b"x\0\x80\0\0\0"] {
            assert!(!sasl_initial_is_well_formed(bad), "{bad:?}");
        }
    }

    #[test]
    fn startup_parameters_become_settings_and_bad_ones_refuse_the_connection() {
        let metadata = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
        let jdbc = metadata(&[("user", "alice"), ("database", "blobhouse"), ("client_encoding", "UTF8"), ("DateStyle", "ISO"), ("TimeZone", "Europe/Berlin"), ("extra_float_digits", "2"), ("application_name", "DBeaver")]);
        let s = startup_settings(&jdbc).expect("pgjdbc's startup is accepted");
        assert_eq!(s.get("application_name").as_deref(), Some("DBeaver"));
        assert_eq!(s.get("timezone").as_deref(), Some("Europe/Berlin"));
        assert_eq!(s.get("session_authorization").as_deref(), Some("alice"));
        let libpq = metadata(&[("user", "bob"), ("options", "-c statement_timeout=5s --search_path=public")]);
        let s = startup_settings(&libpq).expect("libpq's options are applied");
        assert_eq!(s.get("statement_timeout").as_deref(), Some("5000"));
        let e = startup_settings(&metadata(&[("user", "bob"), ("client_encoding", "LATIN1")])).expect_err("not UTF8");
        assert!(e.message.contains("UTF8") && e.severity == "FATAL", "{}", e.message);
        assert!(startup_settings(&metadata(&[("user", "bob"), ("no_such_thing", "1")])).is_err());
    }
}
