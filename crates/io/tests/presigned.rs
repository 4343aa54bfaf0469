//! The download manager against MinIO with URLs presigned by object_store's
//! `Signer`: authentication without hand-written crypto, byte-exact ranges
//! and uploads, and clear errors for a bad signature (403) and a missing
//! object (404) that never show the secret or the signature.

use std::sync::Arc;
use std::time::Duration;

use blobhouse_io::uring::Backend;
use blobhouse_io::{DownloadManager, ManagerOptions};
use blobhouse_testbed::{ACCESS_KEY, BUCKET, Lifetime, Profile, REGION, SECRET_KEY, Testbed};
use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::signer::Signer;
use object_store::{ObjectStoreExt, PutPayload};

fn store(endpoint: &str) -> Arc<AmazonS3> {
    Arc::new(
        AmazonS3Builder::new()
            .with_bucket_name(BUCKET)
            .with_region(REGION)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .build()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presigned_gets_and_puts_on_minio_are_byte_exact_and_errors_are_clear() {
    // The download manager on io_uring, then on the epoll fallback.
    for backend in [Backend::IoUring, Backend::Epoll] {
        presigned_round_trip(backend).await;
    }
}

async fn presigned_round_trip(backend: Backend) {
    let dir = std::env::temp_dir().join(format!("blobhouse-io-presigned-{}-{backend:?}", std::process::id()));
    let tb = Testbed::up(&dir, Profile::Lan, Lifetime::TiedToThisProcess).unwrap();
    let s3 = store(&tb.endpoints().s3_direct);
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let path = Path::from("io-test/object.bin");
    s3.put(&path, PutPayload::from(data.clone())).await.unwrap();
    let sign = |method: http::Method, p: &str| {
        let (s3, p) = (s3.clone(), Path::from(p));
        async move { s3.signed_url(method, &p, Duration::from_secs(300)).await.unwrap().to_string() }
    };
    let mut opts = ManagerOptions::default();
    opts.loop_options.backend = backend;
    let dm = DownloadManager::new(opts).unwrap();
    assert_eq!(dm.backend(), backend);

    // Ranges and the whole object, concurrently.
    let url = sign(http::Method::GET, "io-test/object.bin").await;
    let ranges = [0..1u64, 100..200_000, 2_999_000..3_000_000];
    let gets = ranges.iter().map(|r| dm.get(&url, Some(r.clone())));
    for (got, r) in futures::future::join_all(gets).await.into_iter().zip(ranges.iter()) {
        assert_eq!(got.unwrap().body, data[r.start as usize..r.end as usize], "{r:?}");
    }
    assert_eq!(dm.get(&url, None).await.unwrap().body, data);

    // An upload through a presigned PUT, read back through object_store.
    let upload: Vec<u8> = (0..5_000_000u32).map(|i| (i * 13 % 241) as u8).collect();
    let put_url = sign(http::Method::PUT, "io-test/uploaded.bin").await;
    dm.put(&put_url, Bytes::from(upload.clone())).await.unwrap();
    let back = s3.get(&Path::from("io-test/uploaded.bin")).await.unwrap().bytes().await.unwrap();
    assert_eq!(back, upload);
    let stats = dm.stats();
    assert_eq!(stats.loops.sent_bytes, upload.len() as u64);
    assert_eq!(stats.loops.failures, 0);

    // A missing object: 404, named, no signature in the message.
    let missing = sign(http::Method::GET, "io-test/missing.bin").await;
    let err = dm.get(&missing, None).await.unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.status(), Some(404), "{msg}");
    assert!(msg.contains("io-test/missing.bin") && msg.contains("NoSuchKey") && msg.contains("no such object"), "{msg}");
    assert!(!msg.contains("X-Amz-Signature"), "the signature leaked: {msg}");

    // A forged signature: 403, pointing at the credentials, no secret.
    let at = url.find("X-Amz-Signature=").unwrap() + "X-Amz-Signature=".len();
    let mut forged = url.clone();
    let flipped = if &forged[at..at + 1] == "0" { "1" } else { "0" };
    forged.replace_range(at..at + 1, flipped);
    let err = dm.get(&forged, Some(0..10)).await.unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.status(), Some(403), "{msg}");
    assert!(msg.contains("SignatureDoesNotMatch") && msg.contains("credentials") && msg.contains("io-test/object.bin"), "{msg}");
    assert!(!msg.contains(SECRET_KEY) && !msg.contains("X-Amz-Signature"), "a secret leaked: {msg}");
    drop(dm);
    Testbed::down(&dir).unwrap();
}

