//! Tables a session registers from its embedder's memory — a Python
//! program's DataFrames (`con.register("orders_df", df)`). Each statement
//! of that session sees them by name beside the database's tables, so a
//! DataFrame can be joined with stored tables or inserted into one
//! (`INSERT INTO t SELECT * FROM orders_df`). They are never stored, never
//! committed, and other sessions do not see them.
//!
//! A stored table and a registered one never share a name: registering the
//! name of a stored table is refused ([`Registered::insert`]), and should a
//! table of that name be created later, the stored table is the one seen.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use datafusion::catalog::SchemaProvider;
use datafusion::common::Result;
use datafusion::datasource::TableProvider;

/// A session's registered tables, by name.
#[derive(Default)]
pub struct Registered {
    tables: RwLock<BTreeMap<String, Arc<dyn TableProvider>>>,
}

impl Registered {
    /// Registers `table` as `name`, replacing one registered before under
    /// that name (returned).
    pub fn insert(&self, name: &str, table: Arc<dyn TableProvider>) -> Option<Arc<dyn TableProvider>> {
        self.tables.write().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), table)
    }

    /// Forgets `name`; what was registered under it, if anything.
    pub fn remove(&self, name: &str) -> Option<Arc<dyn TableProvider>> {
        self.tables.write().unwrap_or_else(|p| p.into_inner()).remove(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tables.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }

    /// `database` (a statement's schema of stored tables) with these tables
    /// beside it, as they are now: what the statement sees as `public`.
    pub(crate) fn over(&self, database: Arc<dyn SchemaProvider>) -> Arc<dyn SchemaProvider> {
        let registered = self.tables.read().unwrap_or_else(|p| p.into_inner()).clone();
        if registered.is_empty() {
            return database;
        }
        Arc::new(WithRegistered { database, registered })
    }
}

/// The stored tables first, then the registered ones.
#[derive(Debug)]
struct WithRegistered {
    database: Arc<dyn SchemaProvider>,
    registered: BTreeMap<String, Arc<dyn TableProvider>>,
}

#[async_trait]
impl SchemaProvider for WithRegistered {
    fn table_names(&self) -> Vec<String> {
        let mut names = self.database.table_names();
        names.extend(self.registered.keys().filter(|n| !self.database.table_exist(n)).cloned());
        names
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        match self.database.table(name).await? {
            Some(table) => Ok(Some(table)),
            None => Ok(self.registered.get(name).cloned()),
        }
    }

    fn register_table(&self, name: String, table: Arc<dyn TableProvider>) -> Result<Option<Arc<dyn TableProvider>>> {
        self.database.register_table(name, table)
    }

    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        self.database.deregister_table(name)
    }

    fn table_exist(&self, name: &str) -> bool {
        self.database.table_exist(name) || self.registered.contains_key(name)
    }
}
