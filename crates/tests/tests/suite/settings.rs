//! Settings through a session: what drivers SET on connecting is accepted
//! and read back, what blobhouse cannot honour is refused with PostgreSQL's
//! code and a reason, `current_setting()` reads the session, and the
//! settings table in docs/settings.md is the registry's.

use std::time::Duration;

use blobhouse_engine::settings::{SETTINGS, Scope, Values};
use blobhouse_engine::{EngineOptions, Session};

use crate::common::*;

async fn session(name: &str) -> (TestDb, Session) {
    let db = TestDb::new(Backend::Local, name);
    let e = db.engine(EngineOptions::default()).await;
    (db, e)
}

async fn show(e: &Session, name: &str) -> String {
    scalar(&run(e, &format!("SHOW {name}")).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_drivers_send_on_connecting_is_accepted_and_read_back() {
    let (_db, e) = session("settings-drivers").await;
    e.set_settings(Values::for_user("alice"));
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
        run(&e, sql).await;
    }
    assert_eq!(show(&e, "application_name").await, "PostgreSQL JDBC Driver");
    assert_eq!(show(&e, "extra_float_digits").await, "3");
    assert_eq!(show(&e, "statement_timeout").await, "5000");
    assert_eq!(e.statement_timeout(), Some(Duration::from_secs(5)));
    assert_eq!(show(&e, "DateStyle").await, "ISO, MDY");
    let r = run(&e, "SHOW TRANSACTION ISOLATION LEVEL").await;
    assert_eq!((r.schema.field(0).name().as_str(), scalar(&r).as_str()), ("transaction_isolation", "repeatable read"));
    assert_eq!(show(&e, "myapp.tenant").await, "acme");
    assert_eq!(show(&e, "session_authorization").await, "alice");
    run(&e, "RESET statement_timeout").await;
    assert_eq!(e.statement_timeout(), None);
    // A change to a reported parameter shows in what a client is sent.
    run(&e, "SET application_name TO 'psql'").await;
    assert!(e.reported_settings().contains(&("application_name", "psql".into())));
    run(&e, "RESET ALL").await;
    assert_eq!(show(&e, "application_name").await, "");
    // Sessions do not share their settings.
    let other = e.engine().connect();
    run(&e, "SET application_name = 'mine'").await;
    assert_eq!(show(&other, "application_name").await, "");
    // current_setting() reads the session.
    let r = run(&e, "SELECT current_setting('application_name'), current_setting('max_index_keys'), current_setting('nope.x', true)").await;
    assert_eq!(lines(&r), ["mine|32|NULL"]);
    // … in DML too.
    run(&e, "CREATE TABLE t AS SELECT 1 AS id, 'x' AS app").await;
    run(&e, "UPDATE t SET app = current_setting('application_name') WHERE id = 1").await;
    assert_eq!(scalar(&run(&e, "SELECT app FROM t").await), "mine");
    // SHOW ALL lists every setting of the registry.
    assert_eq!(run(&e, "SHOW ALL").await.rows(), SETTINGS.len() + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_blobhouse_cannot_honour_are_refused_with_reasons() {
    let (_db, e) = session("settings-refused").await;
    let code = |sql: &'static str| {
        let e = &e;
        async move { e.execute(sql).await.expect_err(sql).sqlstate() }
    };
    assert_eq!(code("SET no_such_parameter = 1").await, "42704");
    assert_eq!(code("SET client_encoding = 'LATIN1'").await, "0A000");
    assert_eq!(code("SET DateStyle = 'German'").await, "0A000");
    assert_eq!(code("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE").await, "0A000");
    assert_eq!(code("SET default_transaction_read_only = on").await, "0A000");
    assert_eq!(code("SET search_path = sales").await, "3F000");
    assert_eq!(code("SET extra_float_digits = 9").await, "22023");
    assert_eq!(code("SET statement_timeout = 'soon'").await, "22023");
    assert_eq!(code("SET server_version = '17'").await, "55P02");
    assert_eq!(code("SET GLOBAL application_name = 'x'").await, "0A000");
    assert_eq!(code("SET memory_limit = 'lots'").await, "22023");
    let e2 = fail(&e, "SET no_such_parameter = 1").await;
    assert!(e2.contains("unrecognized configuration parameter \"no_such_parameter\""), "{e2}");
    // A startup parameter is checked the same way; an engine setting is not one.
    let mut v = Values::for_user("bob");
    assert!(v.startup("application_name", "x").is_ok());
    assert_eq!(v.startup("client_encoding", "LATIN1").unwrap_err().sqlstate(), "0A000");
    assert_eq!(v.startup("memory_limit", "1G").unwrap_err().sqlstate(), "0A000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_settings_answer_under_every_alias_and_are_the_engines() {
    let (_db, e) = session("settings-engine").await;
    let other = e.engine().connect();
    run(&e, "SET memory_limit = '2GB'").await;
    // Engine-wide: another session sees it, under every name.
    for name in ["memory_limit", "blobhouse.memory_limit", "datafusion.runtime.memory_limit"] {
        assert_eq!(lines(&run(&other, &format!("SHOW {name}")).await), ["memory_limit|2.0 GiB"], "{name}");
    }
    run(&e, "SET datafusion.runtime.memory_limit = '1GB'").await;
    assert_eq!(other.setting("memory_limit").as_deref(), Some("1.0 GiB"));
    run(&e, "SET cache_policy = 'lru'").await;
    assert_eq!(other.setting("cache_policy").as_deref(), Some("lru"));
    // DataFusion's own options stay the session's.
    run(&e, "SET datafusion.execution.batch_size = 100").await;
    assert_eq!(e.context().state().config().batch_size(), 100);
    assert_ne!(other.context().state().config().batch_size(), 100);
}

/// docs/settings.md lists exactly the registry's settings, with their
/// scope and default.
#[test]
fn the_settings_table_in_the_docs_is_the_registry() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/settings.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table = blobhouse_engine::settings::markdown_table();
    assert!(doc.contains(&table), "{} is out of date; its table must be:\n{table}", path.display());
    assert!(SETTINGS.iter().any(|s| s.scope == Scope::Engine) && SETTINGS.iter().any(|s| s.scope == Scope::Session));
}
