//! Encrypted databases through the binary, as a user runs them: a master
//! key in AWS KMS (moto's KMS server on loopback, started here), local
//! workers that get the key setting from their coordinator, rotation to a
//! local key file, and the errors of a missing, wrong or unreachable key.

use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

fn blobhouse(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
    cmd.args(args);
    for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL_KMS", "BLOBHOUSE_ENCRYPTION"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run blobhouse")
}

fn ok(out: Output) -> String {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    assert!(out.status.success(), "blobhouse failed: {stderr}\n{stdout}");
    stdout
}

fn failed(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "blobhouse succeeded: {}", String::from_utf8_lossy(&out.stdout));
    stderr
}

/// moto's server (AWS APIs faked in one process) on a free loopback port.
struct Moto {
    child: Child,
    endpoint: String,
}

impl Moto {
    fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("moto_server (pip install 'moto[server]'; scripts/install-test-deps.sh)");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto { child, endpoint: format!("http://127.0.0.1:{port}") }
    }

    /// A new symmetric KMS key's id.
    fn create_key(&self) -> String {
        let out = Command::new("python3")
            .args([
                "-c",
                "import boto3, sys; print(boto3.client('kms', endpoint_url=sys.argv[1], region_name='us-east-1', aws_access_key_id='testing', aws_secret_access_key='testing').create_key()['KeyMetadata']['KeyId'])",
                &self.endpoint,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const AWS: [(&str, &str); 3] = [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_REGION", "us-east-1")];

#[test]
fn a_database_encrypted_with_aws_kms_works_with_workers_and_rotates_to_a_key_file() {
    let mut moto = Moto::start();
    let key = moto.create_key();
    let other = moto.create_key();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    let kms = |key: &str| vec!["--db".to_string(), db.to_string(), "--kms-key-id".into(), key.to_string(), "--kms-endpoint".into(), moto.endpoint.clone()];
    let sql = |flags: &[String], more: &[&str], script: &str| {
        let mut args: Vec<&str> = vec!["sql"];
        args.extend(flags.iter().map(String::as_str));
        args.extend(more);
        args.extend(["-c", script]);
        blobhouse(&args, &AWS)
    };

    ok(sql(&kms(&key), &[], "CREATE TABLE t AS SELECT value AS k, 'secret ' || value AS s FROM generate_series(1, 200000)"));
    let out = ok(sql(&kms(&key), &["--workers", "2"], "SELECT count(*), sum(k) FROM t"));
    assert!(out.contains("200000") && out.contains("20000100000"), "{out}");
    let shown = ok(blobhouse(&["keys", "show", "--db", db], &[]));
    assert!(shown.contains("is encrypted") && shown.contains(&format!("aws-kms master key aws-kms:{key}")), "{shown}");

    // No key, another KMS key: one line each, naming the key it needs.
    let err = failed(blobhouse(&["sql", "--db", db, "-c", "SELECT 1"], &AWS));
    assert!(err.contains("is encrypted") && err.contains(&format!("aws-kms:{key}")) && err.contains("--kms-key-id"), "{err}");
    let err = failed(sql(&kms(&other), &[], "SELECT count(*) FROM t"));
    assert!(err.contains(&format!("wrapped by the master key aws-kms:{key}")), "{err}");

    // Rotated to a key file; KMS is not needed any more.
    let key_file = dir.path().join("master.key");
    std::fs::write(&key_file, "5b0b2a7c0b9d4b41a7f2a1e3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7\n").unwrap();
    let mut rotate: Vec<&str> = vec!["keys", "rotate"];
    let flags = kms(&key);
    rotate.extend(flags.iter().map(String::as_str));
    rotate.extend(["--new-key-file", key_file.to_str().unwrap()]);
    let out = ok(blobhouse(&rotate, &AWS));
    assert!(out.contains("keyring 2 wraps the database key with local:"), "{out}");
    let _ = moto.child.kill();
    let _ = moto.child.wait();
    let file = ["--db".to_string(), db.to_string(), "--encryption-key-file".into(), key_file.display().to_string()];
    let out = ok(sql(&file, &[], "SELECT count(*), max(s) FROM t"));
    assert!(out.contains("200000") && out.contains("secret 99999"), "{out}");
    // The old KMS key, now unreachable too, is named as the wrong key.
    let err = failed(sql(&kms(&key), &[], "SELECT 1"));
    assert!(err.contains("a rotated database needs its newest master key") && err.contains("local:"), "{err}");
}
