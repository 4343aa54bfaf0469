//! GETs to MinIO through the event loop with URLs presigned by object_store's
//! `Signer`: authentication without hand-written crypto, byte-exact ranges,
//! and clear errors for a bad signature (403) and a missing object (404).

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use blobhouse_io::uring::{EventLoop, FetchError, Get, LoopOptions};
use blobhouse_testbed::{ACCESS_KEY, BUCKET, Lifetime, Profile, REGION, SECRET_KEY, Testbed};
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

/// A presigned URL as a `Get`: the loop sees only an address, a host and a target.
fn presigned_get(url: &url_like::Url, range: Option<std::ops::Range<u64>>) -> Get {
    let addr: SocketAddr = (url.host.as_str(), url.port).to_socket_addrs().unwrap().next().unwrap();
    Get { addr, host: format!("{}:{}", url.host, url.port), target: url.target.clone(), range, buffer: Vec::new() }
}

/// The parts of a URL the event loop needs, without another crate.
mod url_like {
    pub struct Url {
        pub host: String,
        pub port: u16,
        pub target: String,
    }
    pub fn parse(s: &str) -> Url {
        let rest = s.strip_prefix("http://").expect("http URL");
        let (authority, target) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let (host, port) = authority.rsplit_once(':').map(|(h, p)| (h.to_string(), p.parse().unwrap())).unwrap_or((authority.to_string(), 80));
        Url { host, port, target: target.to_string() }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presigned_gets_on_minio_are_byte_exact_and_errors_are_clear() {
    let dir = std::env::temp_dir().join(format!("blobhouse-io-presigned-{}", std::process::id()));
    let tb = Testbed::up(&dir, Profile::Lan, Lifetime::TiedToThisProcess).unwrap();
    let s3 = store(&tb.endpoints().s3_direct);
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let path = Path::from("io-test/object.bin");
    s3.put(&path, PutPayload::from(data.clone())).await.unwrap();

    let signed = |p: &Path| {
        let (s3, p) = (s3.clone(), p.clone());
        async move { s3.signed_url(http::Method::GET, &p, Duration::from_secs(300)).await.unwrap().to_string() }
    };
    let url = url_like::parse(&signed(&path).await);
    let missing = url_like::parse(&signed(&Path::from("io-test/missing.bin")).await);
    let mut forged = url_like::parse(&signed(&path).await);
    // Flip one hex digit of the signature.
    let at = forged.target.find("X-Amz-Signature=").unwrap() + "X-Amz-Signature=".len();
    let flipped = if &forged.target[at..at + 1] == "0" { "1" } else { "0" };
    forged.target.replace_range(at..at + 1, flipped);

    let ranges = [0..1u64, 100..200_000, 2_999_000..3_000_000];
    let mut gets: Vec<Get> = ranges.iter().map(|r| presigned_get(&url, Some(r.clone()))).collect();
    gets.push(presigned_get(&url, None));
    gets.push(presigned_get(&missing, None));
    gets.push(presigned_get(&forged, Some(0..10)));
    let results = tokio::task::spawn_blocking(move || EventLoop::new(LoopOptions::default()).unwrap().fetch_all(gets).unwrap()).await.unwrap();

    for (r, range) in results.iter().zip(ranges.iter()) {
        assert_eq!(r.as_ref().unwrap().body, data[range.start as usize..range.end as usize], "{range:?}");
    }
    assert_eq!(results[3].as_ref().unwrap().body, data);
    match &results[4] {
        Err(FetchError::Status { status: 404, detail }) => assert!(detail.contains("NoSuchKey"), "{detail}"),
        other => panic!("missing object: {other:?}"),
    }
    match &results[5] {
        Err(FetchError::Status { status: 403, detail }) => {
            assert!(detail.contains("SignatureDoesNotMatch"), "{detail}");
            assert!(!detail.contains(SECRET_KEY), "the secret leaked: {detail}");
        }
        other => panic!("forged signature: {other:?}"),
    }
    Testbed::down(&dir).unwrap();
}
