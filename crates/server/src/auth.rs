//! Users and their SCRAM-SHA-256 secrets.
//!
//! The server never keeps a password: a user's entry is the salt and the
//! salted password (RFC 5802's `Hi(password, salt, i)`), which is what a
//! SCRAM server needs and what pgwire's `ScramAuth` checks the client's
//! proof against. Entries are written as `scram-sha-256$<iterations>$<salt
//! base64>$<salted base64>` (`blobhouse hash-password` makes one).
//! PostgreSQL's own `pg_authid` form stores StoredKey/ServerKey instead,
//! which pgwire cannot verify against, so that form is not accepted.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use pgwire::api::auth::sasl::scram::gen_salted_password;
use pgwire::api::auth::{AuthSource, LoginInfo, Password};
use pgwire::error::PgWireResult;

use crate::ServerError;

/// SCRAM iterations of the hashes this server makes (PostgreSQL's default).
pub const ITERATIONS: usize = 4096;

/// Length of a fresh salt, bytes.
const SALT_BYTES: usize = 16;

/// One user's SCRAM secret.
#[derive(Clone, PartialEq, Eq)]
struct Secret {
    iterations: usize,
    salt: Vec<u8>,
    salted: Vec<u8>,
}

/// The users who may connect. Its `Debug` shows names only.
#[derive(Clone, Default)]
pub struct Users {
    secrets: HashMap<String, Secret>,
}

impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("Users").field("names", &self.names()).finish()
    }
}

/// A SCRAM entry for `password` with a fresh random salt.
pub fn hash_password(password: &str) -> String {
    let salt: [u8; SALT_BYTES] = rand::random();
    let salted = gen_salted_password(password, &salt, ITERATIONS);
    format!("scram-sha-256${ITERATIONS}${}${}", STANDARD.encode(salt), STANDARD.encode(salted))
}

impl Users {
    /// No users: nobody can log in.
    pub fn new() -> Users {
        Users::default()
    }

    /// The users' names, sorted (what `pg_roles` lists).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.secrets.keys().cloned().collect();
        names.sort();
        names
    }

    /// Whether there is no user at all.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// Adds `name` with a plain `password` (hashed here, then dropped).
    pub fn add_password(&mut self, name: &str, password: &str) -> Result<(), ServerError> {
        check_name(name)?;
        if password.is_empty() {
            return Err(ServerError::Users(format!("user '{name}': the password is empty")));
        }
        let salt: [u8; SALT_BYTES] = rand::random();
        let salted = gen_salted_password(password, &salt, ITERATIONS);
        self.secrets.insert(name.to_string(), Secret { iterations: ITERATIONS, salt: salt.to_vec(), salted });
        Ok(())
    }

    /// Adds `name` with an entry from [`hash_password`].
    pub fn add_hash(&mut self, name: &str, entry: &str) -> Result<(), ServerError> {
        check_name(name)?;
        let bad = |why: &str| ServerError::Users(format!("user '{name}': {why}; expected scram-sha-256$<iterations>$<salt>$<salted password> as `blobhouse hash-password` prints it"));
        let parts: Vec<&str> = entry.trim().split('$').collect();
        let [kind, iterations, salt, salted] = parts[..] else { return Err(bad("the password hash has the wrong number of fields")) };
        if !kind.eq_ignore_ascii_case("scram-sha-256") {
            return Err(bad(&format!("unknown hash kind '{kind}'")));
        }
        let iterations: usize = iterations.parse().map_err(|_| bad("the iteration count is not a number"))?;
        if !(1..=1_000_000).contains(&iterations) {
            return Err(bad("the iteration count is out of range (1 to 1,000,000)"));
        }
        let salt = STANDARD.decode(salt).map_err(|_| bad("the salt is not base64"))?;
        let salted = STANDARD.decode(salted).map_err(|_| bad("the salted password is not base64"))?;
        if salt.is_empty() || salted.len() != 32 {
            return Err(bad("the salt is empty or the salted password is not 32 bytes"));
        }
        self.secrets.insert(name.to_string(), Secret { iterations, salt, salted });
        Ok(())
    }

    /// Whether `password` is `name`'s, for a protocol that sends the
    /// password itself (Flight SQL's basic handshake, inside TLS off
    /// loopback). An unknown name costs the same work as a wrong password,
    /// so the answer's timing tells no one which names exist. CPU-bound
    /// (PBKDF2): call it off the protocol threads.
    pub(crate) fn verify(&self, name: &str, password: &str) -> bool {
        let Some(secret) = self.secrets.get(name) else {
            let _ = gen_salted_password(password, &[0; SALT_BYTES], ITERATIONS);
            return false;
        };
        let salted = gen_salted_password(password, &secret.salt, secret.iterations);
        salted.len() == secret.salted.len() && salted.iter().zip(&secret.salted).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }

    /// The iteration count every entry must share (pgwire's SCRAM takes one
    /// per server), or an error naming the odd user.
    pub(crate) fn iterations(&self) -> Result<usize, ServerError> {
        let mut counts = self.secrets.iter().map(|(n, s)| (n, s.iterations));
        let Some((_, first)) = counts.next() else { return Ok(ITERATIONS) };
        match counts.find(|(_, i)| *i != first) {
            Some((name, i)) => Err(ServerError::Users(format!("user '{name}' has {i} SCRAM iterations and others {first}: make every hash with the same count"))),
            None => Ok(first),
        }
    }
}

fn check_name(name: &str) -> Result<(), ServerError> {
    if name.is_empty() || name.len() > 63 || name.chars().any(|c| c.is_control() || c == ':') {
        return Err(ServerError::Users(format!("'{}' is not a valid user name (1–63 characters, no ':' or control characters)", name.escape_debug())));
    }
    Ok(())
}

/// pgwire's view of [`Users`].
///
/// An unknown user gets a mock secret (a salt derived from the name and a
/// key of this process, a random salted password) instead of an error, so
/// the exchange runs to its last step and fails there exactly as a wrong
/// password does: same step, same words, same timing, nothing that tells a
/// caller which names exist (PostgreSQL's "mock authentication").
#[derive(Debug)]
pub(crate) struct UserSource {
    users: Arc<Users>,
}

/// Keys the mock salts: stable per name for the life of the process (a
/// salt that changed between attempts would give the name away), unknown
/// outside it.
static MOCK_KEY: std::sync::OnceLock<[u8; SALT_BYTES]> = std::sync::OnceLock::new();

impl UserSource {
    pub(crate) fn new(users: Arc<Users>) -> UserSource {
        UserSource { users }
    }
}

#[async_trait]
impl AuthSource for UserSource {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let user = login.user().unwrap_or_default();
        match self.users.secrets.get(user) {
            Some(s) => Ok(Password::new(Some(s.salt.clone()), s.salted.clone())),
            None => {
                let salt = gen_salted_password(user, MOCK_KEY.get_or_init(rand::random), 1)[..SALT_BYTES].to_vec();
                let salted: [u8; 32] = rand::random();
                Ok(Password::new(Some(salt), salted.to_vec()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip_and_bad_ones_are_named() {
        let entry = hash_password("s3cret");
        assert!(!entry.contains("s3cret"));
        let mut users = Users::new();
        users.add_hash("alice", &entry).expect("a fresh hash parses");
        users.add_password("bob", "other").expect("a password");
        assert_eq!(users.iterations().expect("one count"), ITERATIONS);
        assert!(!format!("{users:?}").contains("s3cret"));
        for bad in ["", "md5$abc", "scram-sha-256$x$AAAA$AAAA", "scram-sha-256$4096$!!$AAAA", "scram-sha-256$4096$AAAA$AAAA"] {
            let e = users.add_hash("carol", bad).expect_err(bad).to_string();
            assert!(e.contains("carol") && e.contains("hash-password"), "{e}");
        }
        assert!(users.verify("alice", "s3cret") && users.verify("bob", "other"));
        assert!(!users.verify("alice", "other") && !users.verify("nobody", "s3cret") && !users.verify("alice", ""));
        assert!(users.add_password("", "x").is_err());
        assert!(users.add_password("dave", "").is_err());
    }
}
