//! The audit wrapper must really catch overwrites, or the suite-wide guard
//! would prove nothing.

use std::sync::Arc;

use blobhouse_testkit::{AuditStore, Request};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

#[tokio::test]
async fn overwrites_fail_and_are_recorded() {
    let audit = AuditStore::new(Arc::new(InMemory::new()));
    let p = Path::from("a/b");
    audit.put(&p, PutPayload::from_static(b"1")).await.unwrap();
    assert!(audit.overwrites().is_empty());
    let err = audit.put(&p, PutPayload::from_static(b"2")).await.unwrap_err();
    assert!(err.to_string().contains("overwrite of existing object a/b"), "{err}");
    assert_eq!(audit.overwrites(), vec!["a/b".to_string()]);
    assert_eq!(&audit.get(&p).await.unwrap().bytes().await.unwrap()[..], b"1", "the original must survive");
    // put-if-absent on an existing key is refused by the store itself: not an overwrite.
    let create = PutOptions { mode: PutMode::Create, ..Default::default() };
    assert!(matches!(audit.put_opts(&p, PutPayload::from_static(b"3"), create).await, Err(object_store::Error::AlreadyExists { .. })));
    assert_eq!(audit.overwrites().len(), 1);
    assert!(audit.requests().iter().any(|r| matches!(r, Request::Get { path, .. } if path == "a/b")));
}
