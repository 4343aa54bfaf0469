//! A read-only Apache Iceberg REST catalog of the served database, so that
//! DuckDB (`ATTACH … (TYPE iceberg, ENDPOINT …)`), pyiceberg's
//! `RestCatalog` and Spark attach it by URL and read each table through
//! the Iceberg metadata blobhouse writes (`blobhouse_storage::iceberg`).
//!
//! It answers the five GETs those clients make — configuration,
//! namespaces, one namespace, its tables, one table — on the server's HTTP
//! listener, behind the same bearer token as `/metrics`. The one
//! namespace is `public`, the SQL schema of the tables. Anything that
//! would change the catalog is refused: tables change through SQL.
//!
//! Why no crate: the routes are five JSON answers over state the engine
//! already has; an Iceberg catalog library would bring its own storage
//! and arrow versions for them.

use serde_json::{Value as Json, json};

use blobhouse_engine::Engine;
use blobhouse_storage::iceberg;

/// The namespace every table is in.
pub(crate) const NAMESPACE: &str = "public";

/// An HTTP answer: status line and JSON body.
pub(crate) type Answer = (&'static str, String);

/// The answer to `method path` if it is a catalog route (`/v1/…`), else
/// `None`.
pub(crate) async fn answer(method: &str, path: &str, engine: &Engine) -> Option<Answer> {
    let rest = path.strip_prefix("/v1/")?;
    if method != "GET" {
        return Some(error("405 Method Not Allowed", "NotSupportedException", "this Iceberg catalog is read-only: change blobhouse tables with SQL"));
    }
    let parts: Vec<String> = rest.split('/').map(decode).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    Some(match parts.as_slice() {
        ["config"] => ok(json!({"defaults": {}, "overrides": {}})),
        ["namespaces"] => ok(json!({"namespaces": [[NAMESPACE]]})),
        ["namespaces", ns] => match namespace(ns) {
            Ok(()) => ok(json!({"namespace": [NAMESPACE], "properties": {}})),
            Err(e) => e,
        },
        ["namespaces", ns, "tables"] => match namespace(ns) {
            Ok(()) => match engine.database().refresh().await {
                Ok(v) => ok(json!({"identifiers": v.tables.keys().map(|t| json!({"namespace": [NAMESPACE], "name": t})).collect::<Vec<_>>()})),
                Err(e) => error("503 Service Unavailable", "ServiceUnavailableException", &e.to_string()),
            },
            Err(e) => e,
        },
        ["namespaces", ns, "tables", table] => match namespace(ns) {
            Ok(()) => load_table(engine, table).await,
            Err(e) => e,
        },
        _ => error("404 Not Found", "NoSuchEndpointException", &format!("no catalog route /v1/{rest}: this read-only catalog serves config, namespaces and tables")),
    })
}

/// `LoadTableResult`: the table's newest Iceberg metadata, inline and by
/// location.
async fn load_table(engine: &Engine, table: &str) -> Answer {
    let db = engine.database();
    let version = match db.refresh().await {
        Ok(v) => v,
        Err(e) => return error("503 Service Unavailable", "ServiceUnavailableException", &e.to_string()),
    };
    if !version.tables.contains_key(table) {
        return error("404 Not Found", "NoSuchTableException", &format!("table {NAMESPACE}.{table} does not exist (GET /v1/namespaces/{NAMESPACE}/tables lists them)"));
    }
    match iceberg::current(db, &version, table).await {
        Ok(Some(state)) => ok(json!({"metadata-location": db.object_uri(&state.path), "metadata": state.metadata, "config": {}})),
        Ok(None) => error(
            "404 Not Found",
            "NoSuchTableException",
            &format!("table {table} has no Iceberg metadata for its current version: run ALTER DATABASE SET iceberg = on, which writes it"),
        ),
        Err(e) => error("404 Not Found", "NoSuchTableException", &e.to_string()),
    }
}

fn namespace(ns: &str) -> Result<(), Answer> {
    if ns == NAMESPACE {
        Ok(())
    } else {
        Err(error("404 Not Found", "NoSuchNamespaceException", &format!("namespace '{ns}' does not exist: every table is in '{NAMESPACE}'")))
    }
}

fn ok(body: Json) -> Answer {
    ("200 OK", body.to_string())
}

/// The REST spec's `ErrorModel`.
fn error(status: &'static str, kind: &str, message: &str) -> Answer {
    let code: u16 = status.split(' ').next().and_then(|c| c.parse().ok()).unwrap_or(500);
    (status, json!({"error": {"message": message, "type": kind, "code": code}}).to_string())
}

/// Percent-decoding of one path segment.
fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = segment.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_decoded_and_errors_follow_the_error_model() {
        assert_eq!(decode("a%20b%1Fc"), "a b\u{1f}c");
        assert_eq!(decode("100%"), "100%");
        let (status, body) = error("404 Not Found", "NoSuchTableException", "gone");
        let body: Json = serde_json::from_str(&body).unwrap();
        assert_eq!(status, "404 Not Found");
        assert_eq!(body["error"]["code"], 404);
        assert_eq!(body["error"]["type"], "NoSuchTableException");
    }
}
