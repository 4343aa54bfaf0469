//! Transaction control: BEGIN, COMMIT, ROLLBACK and SAVEPOINT, and where a
//! session is — each statement a transaction of its own, inside BEGIN …
//! COMMIT, or in a transaction a failed statement aborted (PostgreSQL's
//! rule: then only ROLLBACK, or COMMIT that rolls back, is taken).
//!
//! Isolation is snapshot isolation (docs/transactions.md): REPEATABLE READ
//! and READ COMMITTED, which it is stronger than, are accepted;
//! SERIALIZABLE is refused rather than silently weakened.

use std::sync::Arc;

use datafusion::sql::sqlparser::ast::{Statement as S, TransactionIsolationLevel as L, TransactionMode as M};

use blobhouse_storage::{Database, Transaction};

use crate::result::{Notice, QueryResult, empty_result};
use crate::{EngineError, TxnRule};

/// A transaction control statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Control {
    Begin,
    Commit,
    Rollback,
    /// SAVEPOINT or RELEASE SAVEPOINT: accepted inside a transaction, where
    /// they change nothing (a released savepoint's changes stay in the
    /// transaction anyway); drivers issue them around their own queries.
    Savepoint,
    /// A control statement blobhouse refuses (ROLLBACK TO SAVEPOINT,
    /// SERIALIZABLE, AND CHAIN), and why. Refusing it aborts an open
    /// transaction: what it asked for did not happen.
    Refused(String),
}

/// The control statement `s` is, if it is one.
pub(crate) fn control(s: &S) -> Option<Control> {
    Some(match s {
        S::StartTransaction { modes, .. } => {
            for m in modes {
                match m {
                    M::IsolationLevel(L::Serializable) => {
                        return Some(Control::Refused("SERIALIZABLE is not available: blobhouse transactions have snapshot isolation (REPEATABLE READ); see docs/transactions.md".into()));
                    }
                    M::IsolationLevel(_) => {}
                    M::AccessMode(_) => return Some(Control::Refused("READ ONLY / READ WRITE transaction modes are not supported; use BEGIN".into())),
                }
            }
            Control::Begin
        }
        S::Commit { chain: false, .. } => Control::Commit,
        S::Rollback { chain: false, savepoint: None } => Control::Rollback,
        S::Savepoint { .. } | S::ReleaseSavepoint { .. } => Control::Savepoint,
        S::Rollback { savepoint: Some(_), .. } => {
            Control::Refused("ROLLBACK TO SAVEPOINT is not supported: savepoints are accepted and released, but a transaction rolls back only as a whole (ROLLBACK)".into())
        }
        S::Commit { .. } | S::Rollback { .. } => Control::Refused("AND CHAIN is not supported; use BEGIN, COMMIT and ROLLBACK".into()),
        _ => return None,
    })
}

/// A transaction shared by the session and the statement running in it
/// (the INSERT sink adds to it); `None` once it ended.
pub(crate) type TxnSlot = Arc<tokio::sync::Mutex<Option<Transaction>>>;

/// Where a session is.
enum Mode {
    Autocommit,
    Explicit(TxnSlot),
    /// The transaction, and the error that aborted it.
    Aborted(TxnSlot, String),
}

/// One session's transaction state.
pub(crate) struct TxnState {
    mode: std::sync::Mutex<Mode>,
}

impl Default for TxnState {
    fn default() -> Self {
        TxnState { mode: std::sync::Mutex::new(Mode::Autocommit) }
    }
}

impl TxnState {
    fn mode(&self) -> std::sync::MutexGuard<'_, Mode> {
        self.mode.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// BEGIN: later statements read the database version of now plus
    /// their own changes, which become visible together at COMMIT.
    pub(crate) async fn begin(&self, db: &Arc<Database>) -> Result<(), EngineError> {
        if !matches!(*self.mode(), Mode::Autocommit) {
            return Err(EngineError::transaction(TxnRule::InProgress, "there is already a transaction in progress (COMMIT or ROLLBACK it first)"));
        }
        let snapshot = db.refresh().await?;
        let slot = Arc::new(tokio::sync::Mutex::new(Some(Transaction::begin(db, snapshot))));
        *self.mode() = Mode::Explicit(slot);
        Ok(())
    }

    /// COMMIT. A serialization failure or conflict rolls it back and is
    /// returned; so is an earlier failed statement (nothing is committed
    /// then). Without a transaction: nothing to do.
    /// Returns the version it committed, if it changed anything.
    pub(crate) async fn commit(&self) -> Result<Option<u64>, EngineError> {
        let mode = std::mem::replace(&mut *self.mode(), Mode::Autocommit);
        match mode {
            Mode::Autocommit => Ok(None),
            Mode::Explicit(slot) => {
                let txn = slot.lock().await.take();
                if let Some(txn) = txn
                    && let blobhouse_storage::CommitOutcome::Committed(v) = txn.commit().await?
                {
                    return Ok(Some(v.version));
                }
                Ok(None)
            }
            Mode::Aborted(slot, cause) => {
                if let Some(txn) = slot.lock().await.take() {
                    txn.rollback().await;
                }
                Err(EngineError::transaction(TxnRule::Aborted, format!("the transaction was rolled back, not committed: a statement in it failed ({cause})")))
            }
        }
    }

    /// ROLLBACK: deletes what the transaction uploaded.
    pub(crate) async fn rollback(&self) {
        let mode = std::mem::replace(&mut *self.mode(), Mode::Autocommit);
        if let Mode::Explicit(slot) | Mode::Aborted(slot, _) = mode
            && let Some(txn) = slot.lock().await.take()
        {
            txn.rollback().await;
        }
    }

    /// Marks an open transaction aborted by `cause`.
    pub(crate) fn abort(&self, cause: &EngineError) {
        let mut mode = self.mode();
        if let Mode::Explicit(slot) = &*mode {
            *mode = Mode::Aborted(slot.clone(), cause.to_string());
        }
    }

    /// What aborted the open transaction, if one is open and aborted.
    pub(crate) fn aborted_by(&self) -> Option<String> {
        match &*self.mode() {
            Mode::Aborted(_, cause) => Some(cause.clone()),
            _ => None,
        }
    }

    /// Whether a transaction begun with BEGIN is open (aborted or not).
    pub(crate) fn in_transaction(&self) -> bool {
        !matches!(*self.mode(), Mode::Autocommit)
    }

    /// The open transaction's slot, if one is open (aborted or not), for
    /// statements that only look (Describe).
    pub(crate) fn open_slot(&self) -> Option<TxnSlot> {
        match &*self.mode() {
            Mode::Explicit(slot) | Mode::Aborted(slot, _) => Some(slot.clone()),
            Mode::Autocommit => None,
        }
    }

    /// A statement joins the open transaction: it counts as aborted until
    /// the statement has succeeded ([`TxnState::finish`]), so a failed or
    /// cancelled statement leaves it aborted. `None` outside BEGIN … COMMIT;
    /// an error when the transaction is aborted.
    pub(crate) fn join(&self, what: &str) -> Result<Option<TxnSlot>, EngineError> {
        let mut mode = self.mode();
        match &*mode {
            Mode::Autocommit => Ok(None),
            Mode::Aborted(_, cause) => Err(EngineError::TransactionAborted { cause: cause.clone() }),
            Mode::Explicit(slot) => {
                let slot = slot.clone();
                *mode = Mode::Aborted(slot.clone(), format!("'{what}' did not finish"));
                Ok(Some(slot))
            }
        }
    }

    /// A joined statement ended: the transaction goes on, or is aborted by
    /// its error.
    pub(crate) fn finish(&self, slot: TxnSlot, error: Option<&EngineError>) {
        *self.mode() = match error {
            None => Mode::Explicit(slot),
            Some(e) => Mode::Aborted(slot, e.to_string()),
        };
    }

    /// Runs a control statement.
    pub(crate) async fn run(&self, db: &Arc<Database>, control: Control, started: std::time::Instant) -> Result<QueryResult, EngineError> {
        let mut result = empty_result(started);
        match control {
            Control::Refused(message) => {
                let e = EngineError::Unsupported(message);
                self.abort(&e);
                return Err(e);
            }
            // PostgreSQL's answer to BEGIN inside a transaction: a
            // warning, and the transaction goes on. (An error here would
            // make retry loops that BEGIN again spin.)
            Control::Begin if self.aborted_by().is_some() => {
                return Err(EngineError::TransactionAborted { cause: self.aborted_by().unwrap_or_default() });
            }
            Control::Begin if self.in_transaction() => {
                result.notices.push(Notice { severity: "WARNING", sqlstate: "25001", message: "there is already a transaction in progress".into() })
            }
            Control::Begin => self.begin(db).await?,
            Control::Commit => match self.commit().await {
                Ok(Some(version)) => result.notices.extend(crate::interop::iceberg_notice(db, version)),
                Ok(None) => {}
                // COMMIT of an aborted transaction rolls it back and says
                // so, as PostgreSQL does; it is not an error.
                Err(EngineError::Transaction { rule: TxnRule::Aborted, message }) => {
                    result.rolled_back = true;
                    result.notices.push(Notice { severity: "WARNING", sqlstate: "25P02", message });
                }
                Err(e) => return Err(e),
            },
            Control::Rollback => self.rollback().await,
            Control::Savepoint => match &*self.mode() {
                Mode::Explicit(_) => {}
                Mode::Aborted(_, cause) => {
                    return Err(EngineError::transaction(TxnRule::Aborted, format!("the transaction is aborted by an earlier failed statement ({cause}): ROLLBACK it")));
                }
                Mode::Autocommit => return Err(EngineError::transaction(TxnRule::NoTransaction, "SAVEPOINT can only be used inside BEGIN … COMMIT")),
            },
        }
        Ok(result)
    }
}

/// The statement's transaction. It has ended only if the session was torn
/// down under the statement; then the objects the statement `uploaded`
/// belong to nobody and are deleted.
pub(crate) async fn joined<'a>(db: &Database, slot: &'a mut Option<Transaction>, uploaded: &[blobhouse_storage::format::DataObject]) -> Result<&'a mut Transaction, EngineError> {
    if slot.is_none() {
        db.delete_unreferenced(uploaded.iter().map(|o| o.path.clone()).collect()).await;
    }
    slot.as_mut().ok_or_else(|| EngineError::transaction(TxnRule::Ended, "the transaction has ended"))
}

/// Applies `f` to the statement's transaction.
pub(crate) async fn stage(scope: &crate::provider::Scope, f: impl FnOnce(&mut Transaction) -> Result<bool, blobhouse_storage::StorageError>) -> Result<bool, EngineError> {
    let mut slot = scope.txn.lock().await;
    let txn = slot.as_mut().ok_or_else(|| EngineError::transaction(TxnRule::Ended, "the transaction has ended"))?;
    Ok(f(txn)?)
}
