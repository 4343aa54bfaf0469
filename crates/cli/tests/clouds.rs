//! The `blobhouse` binary on Azure Blob Storage (Azurite, started by the
//! harness), as a user reaches it: the usual environment, or flags with a
//! container SAS token; and the errors a wrong or missing setting gives,
//! on Azure and on S3.

use std::process::{Command, Output};

use blobhouse_testkit::AzuriteServer;
use blobhouse_testkit::azurite::{ACCOUNT, ACCOUNT_KEY};

fn blobhouse(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
    cmd.args(args);
    // Nothing of the developer's own clouds leaks in.
    for var in ["AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run blobhouse")
}

fn ok(out: Output) -> (String, String) {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    assert!(out.status.success(), "blobhouse failed: {stderr}\n{stdout}");
    (stdout, stderr)
}

#[test]
fn an_azure_database_written_by_one_process_is_read_and_verified_by_others() {
    let azurite = AzuriteServer::shared();
    let db = azurite.fresh_url("cli-azure");
    let env = azurite.env();
    ok(blobhouse(&["sql", "--db", &db, "-c", "CREATE TABLE t AS SELECT value AS k, value % 7 AS g FROM generate_series(1, 100000); DELETE FROM t WHERE g = 0"], &env));
    let (out, _) = ok(blobhouse(&["sql", "--db", &db, "-c", "SELECT count(*), sum(k) FROM t"], &env));
    assert!(out.contains("85715") && out.contains("4285785715"), "{out}");
    let (out, _) = ok(blobhouse(&["verify", "--db", &db], &env));
    assert!(out.contains("no damage found") && out.contains("1 deletion vectors"), "{out}");
}

#[test]
fn a_container_sas_token_reads_and_writes_and_the_shell_says_reads_skip_the_download_manager() {
    let azurite = AzuriteServer::shared();
    let db = azurite.fresh_url("cli-sas");
    let sas = format!("azure_storage_sas_token={}", azurite.container_sas());
    let account = format!("azure_storage_account_name={ACCOUNT}");
    let args = |sql: &'static str| -> Vec<String> {
        ["sql", "--db", &db, "--endpoint", &azurite.endpoint, "--store-option", &account, "--store-option", &sas, "-c", sql].iter().map(|s| s.to_string()).collect()
    };
    let run = |sql: &'static str| {
        let a = args(sql);
        ok(blobhouse(&a.iter().map(String::as_str).collect::<Vec<_>>(), &[]))
    };
    run("CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 100000)");
    let (out, err) = run("SELECT count(*), sum(k) FROM t");
    assert!(out.contains("100000") && out.contains("5000050000"), "{out}");
    assert_eq!(err.matches("cannot presign").count(), 1, "said once: {err}");
}

#[test]
fn a_missing_container_and_a_refused_key_are_one_short_line_naming_azure_settings() {
    let azurite = AzuriteServer::shared();
    let key = format!("azure_storage_account_key={ACCOUNT_KEY}");
    let account = format!("azure_storage_account_name={ACCOUNT}");
    let missing = blobhouse(&["sql", "--db", "az://no-such-container/db", "--endpoint", &azurite.endpoint, "--store-option", &account, "--store-option", &key, "-c", "SELECT 1"], &[]);
    let err = String::from_utf8_lossy(&missing.stderr).to_string();
    assert!(!missing.status.success());
    assert!(err.contains("the container does not exist") && err.contains("create the container"), "{err}");
    assert!(err.len() < 400 && !err.contains("<?xml") && !err.contains("AWS_"), "{} bytes: {err}", err.len());

    let wrong = "azure_storage_account_key=d3Jvbmcga2V5IGZvciBibG9iaG91c2UgdGVzdHMgb25seQ==";
    let refused = blobhouse(&["sql", "--db", &azurite.fresh_url("cli-refused"), "--endpoint", &azurite.endpoint, "--store-option", &account, "--store-option", wrong, "-c", "SELECT 1"], &[]);
    let err = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success());
    assert!(err.contains("AZURE_STORAGE_ACCOUNT_KEY") && !err.contains("AWS_"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let unknown = blobhouse(&["sql", "--db", "az://c/db", "--store-option", "aws_region=x", "-c", "SELECT 1"], &[]);
    let err = String::from_utf8_lossy(&unknown.stderr).to_string();
    assert!(err.contains("unknown store option 'aws_region' for Azure"), "{err}");
}

/// With no credential anywhere, S3's chain ends at the instance metadata
/// service (here moved to a closed port on loopback, as off EC2 it does not
/// answer): one line says what was tried and what to set, once.
#[test]
fn no_aws_credentials_is_one_line_listing_the_sources_tried() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(); // closed once dropped
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
        cmd.env_remove(k);
    }
    let out = cmd
        .env("AWS_METADATA_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env("HOME", std::env::temp_dir())
        .args(["sql", "--db", "s3://some-bucket/db", "--endpoint", "http://127.0.0.1:9", "-c", "SELECT 1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success());
    assert!(err.contains("no AWS credentials found") && err.contains("AWS_WEB_IDENTITY_TOKEN_FILE") && err.contains("Hint: set AWS_ACCESS_KEY_ID"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(err.matches("127.0.0.1").count(), 0, "the metadata address is not repeated: {err}");
}

/// `blobhouse` with `env` and no AWS keys of its own: what a user with
/// only a profile has.
fn with_profile(env: &[(&str, String)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str()))).args(args).output().expect("run blobhouse")
}

/// AWS named profiles, as the AWS CLI writes them: keys in the credentials
/// file, and a `credential_process` in the config file (what SSO users and
/// credential helpers use), against MinIO; a missing profile and a failing
/// process say which profile and what went wrong.
#[test]
fn aws_profiles_with_keys_or_a_credential_process_reach_the_store() {
    let minio = blobhouse_testkit::MinioServer::shared();
    let (key, secret) = (blobhouse_testkit::minio::ACCESS_KEY, blobhouse_testkit::minio::SECRET_KEY);
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    let config = dir.path().join("config");
    std::fs::write(&credentials, format!("[default]\nregion = us-east-1\n\n[keys]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")).unwrap();
    let process = dir.path().join("helper.sh");
    std::fs::write(&process, format!("#!/bin/sh\nprintf '{{\"Version\": 1, \"AccessKeyId\": \"{key}\", \"SecretAccessKey\": \"{secret}\"}}'\n")).unwrap();
    std::fs::set_permissions(&process, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(&config, format!("[profile sso]\ncredential_process = {}\nregion = us-east-1\n\n[profile broken]\ncredential_process = sh -c 'echo the SSO session has expired, run aws sso login >&2; exit 2'\n", process.display())).unwrap();
    let env = |profile: &str| -> Vec<(&str, String)> {
        vec![
            ("AWS_SHARED_CREDENTIALS_FILE", credentials.display().to_string()),
            ("AWS_CONFIG_FILE", config.display().to_string()),
            ("AWS_PROFILE", profile.to_string()),
            ("AWS_ENDPOINT_URL", minio.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    };
    for profile in ["keys", "sso"] {
        let db = minio.fresh_url(&format!("cli-profile-{profile}"));
        let out = with_profile(&env(profile), &["sql", "--db", &db, "-c", "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 1000); SELECT sum(k) FROM t"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && stdout.contains("500500"), "profile {profile}: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    }
    let missing = with_profile(&env("nope"), &["sql", "--db", &minio.fresh_url("cli-profile-nope"), "-c", "SELECT 1"]);
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && err.contains("AWS_PROFILE is 'nope'") && err.contains("credentials"), "{err}");
    let broken = with_profile(&env("broken"), &["sql", "--db", &minio.fresh_url("cli-profile-broken"), "-c", "SELECT 1"]);
    let err = String::from_utf8_lossy(&broken.stderr);
    assert!(!broken.status.success() && err.contains("profile 'broken'") && err.contains("aws sso login"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Two credential endpoints faked on loopback, vending fresh temporary
/// credentials from MinIO's STS, reported to expire `ttl` seconds later;
/// every fetch of credentials is a line in `log`:
/// - `container`: what ECS and EKS Pod Identity give a container — a GET
///   of `/creds` with the right Authorization;
/// - `imds`: EC2's instance metadata service, version 2 — a PUT for a
///   session token, then the role's name and its credentials, each GET
///   with that token (a GET without it is refused, as IMDSv2 does);
/// - `msi`: Azure's managed identity endpoint (IMDS's `/metadata/identity`
///   moved to loopback): an OAuth token for storage, a JWT that Azurite's
///   `--oauth basic` checks for issuer, audience and lifetime;
/// - `gce`: the GCE metadata server's access token of the instance's
///   service account (the `Metadata-Flavor: Google` header required);
/// - `sts`: STS's AssumeRoleWithWebIdentity over TLS (EKS IRSA), the
///   parameters in the query string as object_store sends them, the web
///   identity token checked.
const FAKE_CREDENTIALS: &str = r#"
import base64, datetime, http.server, json, ssl, sys, time, urllib.parse, boto3
mode, endpoint, key, secret, token, ttl, log = sys.argv[1:8]
sts = boto3.client('sts', endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret, region_name='us-east-1')
ROLE = '/latest/meta-data/iam/security-credentials/'
class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, status, body=b''):
        self.send_response(status); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)
    def credentials(self):
        c = sts.assume_role(RoleArn='arn:aws:iam::000000000000:role/blobhouse', RoleSessionName='blobhouse-test', DurationSeconds=900)['Credentials']
        expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=int(ttl))
        open(log, 'a').write('fetch\n')
        return ('{"Code": "Success", "AccessKeyId": "%s", "SecretAccessKey": "%s", "Token": "%s", "Expiration": "%s"}' % (c['AccessKeyId'], c['SecretAccessKey'], c['SessionToken'], expires.strftime('%Y-%m-%dT%H:%M:%SZ'))).encode()
    def do_POST(self):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        length = int(self.headers.get('Content-Length') or 0)
        q.update(urllib.parse.parse_qs(self.rfile.read(length).decode()) if length else {})
        if mode == 'sts' and q.get('Action') == ['AssumeRoleWithWebIdentity'] and q.get('WebIdentityToken') == [token] and q.get('RoleArn'):
            c = json.loads(self.credentials())
            body = ('<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleWithWebIdentityResult><Credentials>'
                    '<AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey><SessionToken>%s</SessionToken><Expiration>%s</Expiration>'
                    '</Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>' % (c['AccessKeyId'], c['SecretAccessKey'], c['Token'], c['Expiration'])).encode()
            return self.reply(200, body)
        self.reply(403)
    def do_PUT(self):
        if mode == 'imds' and self.path == '/latest/api/token' and self.headers.get('X-aws-ec2-metadata-token-ttl-seconds'):
            return self.reply(200, token.encode())
        self.reply(403)
    def do_GET(self):
        if mode == 'msi' and self.path.startswith('/msi/token?') and self.headers.get('Metadata') == 'true' and 'resource=https%3A%2F%2Fstorage.azure.com' in self.path:
            open(log, 'a').write('fetch\n')
            now = int(time.time())
            b64 = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b'=').decode()
            jwt = b64({'typ': 'JWT', 'alg': 'RS256'}) + '.' + b64({'aud': 'https://storage.azure.com', 'iss': 'https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/', 'nbf': now - 60, 'iat': now - 60, 'exp': now + int(ttl), 'oid': token}) + '.c2lnbmF0dXJl'
            return self.reply(200, json.dumps({'access_token': jwt, 'expires_in': ttl, 'expires_on': str(now + int(ttl)), 'resource': 'https://storage.azure.com', 'token_type': 'Bearer'}).encode())
        if mode == 'gce' and self.path == '/computeMetadata/v1/instance/service-accounts/default/email' and self.headers.get('Metadata-Flavor') == 'Google':
            return self.reply(200, b'blobhouse@blobhouse-test.iam.gserviceaccount.com')
        if mode == 'gce' and self.path.startswith('/computeMetadata/v1/instance/service-accounts/default/token') and self.headers.get('Metadata-Flavor') == 'Google':
            open(log, 'a').write('fetch\n')
            return self.reply(200, json.dumps({'access_token': token, 'expires_in': int(ttl), 'token_type': 'Bearer'}).encode())
        if mode == 'container' and self.path == '/creds' and self.headers.get('Authorization') == token:
            return self.reply(200, self.credentials())
        if mode == 'imds' and self.headers.get('X-aws-ec2-metadata-token') == token:
            if self.path == ROLE:
                return self.reply(200, b'blobhouse-role')
            if self.path == ROLE + 'blobhouse-role':
                return self.reply(200, self.credentials())
        self.reply(401 if mode == 'imds' else 403)
    def log_message(self, *args): pass
server = http.server.HTTPServer(('127.0.0.1', 0), Handler)
if mode == 'sts':
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(sys.argv[8], sys.argv[9])
    server.socket = tls.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// Starts [`FAKE_CREDENTIALS`] in `mode`; its port and a count of its
/// credential fetches.
fn fake_credentials(mode: &str, token: &str, ttl: u32, dir: &std::path::Path) -> (std::process::Child, String, impl Fn() -> usize) {
    use std::io::{BufRead, BufReader};
    let minio = blobhouse_testkit::MinioServer::shared();
    let log = dir.join(format!("{mode}-fetches"));
    let certs = dir.join("certs");
    if mode == "sts" {
        blobhouse_testbed::make_certificates(&certs).expect("openssl makes the fake STS's certificate");
    }
    let mut fake = Command::new("python3")
        .args(["-c", FAKE_CREDENTIALS, mode, &minio.endpoint, blobhouse_testkit::minio::ACCESS_KEY, blobhouse_testkit::minio::SECRET_KEY, token, &ttl.to_string()])
        .arg(&log)
        .args([certs.join("cert.pem"), certs.join("key.pem")])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with boto3 (scripts/install-test-deps.sh)");
    let mut port = String::new();
    BufReader::new(fake.stdout.take().unwrap()).read_line(&mut port).unwrap();
    assert!(!port.trim().is_empty(), "the fake credentials endpoint did not start");
    (fake, port.trim().to_string(), move || std::fs::read_to_string(&log).map_or(0, |t| t.lines().count()))
}

/// On EC2 with an instance role: IMDSv2 (here moved to loopback with
/// AWS_METADATA_ENDPOINT) gives the role's temporary credentials.
#[test]
fn an_instance_role_from_imds_v2_reaches_the_store() {
    let minio = blobhouse_testkit::MinioServer::shared();
    let dir = tempfile::tempdir().unwrap();
    let (mut fake, port, fetches) = fake_credentials("imds", "imds-session-token", 3600, dir.path());
    write_and_read_with_only(&minio.fresh_url("cli-imds"), dir.path(), &[("AWS_METADATA_ENDPOINT", format!("http://127.0.0.1:{port}"))]);
    let _ = fake.kill();
    assert!(fetches() >= 1);
}

/// On GCE (or GKE) with the instance's service account: the metadata
/// server (moved to loopback with GCE_METADATA_HOST) gives the access
/// token; no key file anywhere. Without a key nothing can presign, so reads
/// go through the store client (the shell says so once).
#[test]
fn a_gce_service_account_from_the_metadata_server_reaches_gcs() {
    let gcs = blobhouse_testkit::GcsServer::shared();
    let dir = tempfile::tempdir().unwrap();
    let (mut fake, port, fetches) = fake_credentials("gce", "gce-access-token", 3600, dir.path());
    let out = write_and_read_on_gcs_with_only(&gcs.fresh_url("cli-gce"), dir.path(), &[("GCE_METADATA_HOST", format!("127.0.0.1:{port}"))]);
    let _ = fake.kill();
    assert!(fetches() >= 1, "no token was asked of the metadata server");
    // signBlob (IAM) is out of reach here: reads fall back, and say so.
    assert!(String::from_utf8_lossy(&out.stderr).contains("instead of the download manager"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Application default credentials: `GOOGLE_APPLICATION_CREDENTIALS`
/// naming a service account's key file, nothing else (the metadata server
/// moved to a closed port, so a fallback to it would fail).
#[test]
fn application_default_credentials_reach_gcs() {
    let gcs = blobhouse_testkit::GcsServer::shared();
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let env = [("GOOGLE_APPLICATION_CREDENTIALS", gcs.service_account.display().to_string()), ("GCE_METADATA_HOST", closed.to_string())];
    write_and_read_on_gcs_with_only(&gcs.fresh_url("cli-adc"), dir.path(), &env);
}

/// Writes and reads a table at `db` (on the harness's GCS) through
/// `blobhouse sql` given no Google setting but the endpoint and `env`: the
/// credentials come from the source `env` names. Returns the run.
fn write_and_read_on_gcs_with_only(db: &str, home: &std::path::Path, env: &[(&str, String)]) -> Output {
    let gcs = blobhouse_testkit::GcsServer::shared();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("GOOGLE_")) {
        cmd.env_remove(k);
    }
    let out = cmd
        .env("HOME", home)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["sql", "--db", db, "--endpoint", &gcs.endpoint, "-c", "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 1000); SELECT sum(k) FROM t"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("500500"), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    out
}

/// On an Azure VM (or AKS, App Service) with a managed identity: the
/// identity endpoint (moved to loopback with `azure_msi_endpoint`) gives an
/// OAuth token, which Azurite — over HTTPS, as OAuth requires — accepts;
/// no account key anywhere.
#[test]
fn an_azure_managed_identity_token_reaches_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    blobhouse_testbed::make_certificates(&certs).expect("openssl makes Azurite's certificate");
    let azurite = AzuriteServer::start_oauth(&certs.join("cert.pem"), &certs.join("key.pem")).expect("Azurite with HTTPS and OAuth");
    let (mut fake, port, fetches) = fake_credentials("msi", "managed-identity-object-id", 3600, dir.path());
    let db = azurite.fresh_url("cli-msi");
    let account = format!("azure_storage_account_name={ACCOUNT}");
    let msi = format!("azure_msi_endpoint=http://127.0.0.1:{port}/msi/token");
    let out = blobhouse(
        &[
            "sql", "--db", &db, "--endpoint", &azurite.endpoint,
            "--store-option", &account, "--store-option", &msi,
            // The test CA is not in the system's store.
            "--store-option", "azure_allow_invalid_certificates=true",
            "-c", "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 1000); SELECT sum(k) FROM t",
        ],
        &[("HOME", dir.path().display().to_string())],
    );
    let _ = fake.kill();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("500500"), "{stderr}\n{stdout}");
    assert!(fetches() >= 1, "no token was asked of the identity endpoint");
}

/// Writes and reads a table at `db` (on MinIO) through `blobhouse sql`
/// given no AWS setting but MinIO's endpoint and region and `env`: the
/// credentials come from the source `env` names.
fn write_and_read_with_only(db: &str, home: &std::path::Path, env: &[(&str, String)]) {
    let minio = blobhouse_testkit::MinioServer::shared();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
        cmd.env_remove(k);
    }
    let out = cmd
        .env("HOME", home)
        .env("AWS_ENDPOINT_URL", &minio.endpoint)
        .env("AWS_REGION", "us-east-1")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(["sql", "--db", db, "-c", "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 1000); SELECT sum(k) FROM t"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("500500"), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
}

/// A long-running `serve` on container credentials (ECS task role, EKS Pod
/// Identity): it fetches them from the endpoint with the token file's
/// token, and fetches new ones when those it holds near their expiry —
/// the second query, 3 s later, is served with refreshed credentials.
#[test]
fn serve_on_container_credentials_refreshes_them_before_they_expire() {
    use std::io::{BufRead, BufReader};
    let minio = blobhouse_testkit::MinioServer::shared();
    let db = minio.fresh_url("cli-container-creds");
    let mut keyed = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
    let out = keyed.envs(minio.env()).args(["sql", "--db", &db, "-c", "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 100000)"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "container-token-4711").unwrap();
    // 302 s: object_store refreshes credentials with less than 300 s left.
    let (mut fake, port, fetches) = fake_credentials("container", "container-token-4711", 302, dir.path());

    let mut serve = Command::new(env!("CARGO_BIN_EXE_blobhouse"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
        serve.env_remove(k);
    }
    let mut child = serve
        .env("HOME", dir.path())
        .env("AWS_ENDPOINT_URL", &minio.endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_CONTAINER_CREDENTIALS_FULL_URI", format!("http://127.0.0.1:{port}/creds"))
        .env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", &token_file)
        .env("BLOBHOUSE_PASSWORD", "container-test-password")
        .args(["serve", "--db", &db, "--user", "alice", "--pg-listen", "127.0.0.1:0", "--flight-listen", "off"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let pg_port = loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve stopped before serving");
        if let Some(rest) = line.strip_prefix("serving ") {
            break rest.split(" on ").nth(1).unwrap().split([',', ';', ' ']).next().unwrap().rsplit(':').next().unwrap().to_string();
        }
    };
    let psql = |sql: &str| {
        let out = Command::new("psql")
            .arg(format!("host=127.0.0.1 port={pg_port} user=alice dbname=blobhouse sslmode=disable"))
            .args(["-X", "-A", "-t", "-c", sql])
            .env("PGPASSWORD", "container-test-password")
            .output()
            .unwrap();
        (String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (first, err) = psql("SELECT sum(k) FROM t");
    assert_eq!(first, "5000050000", "{err}");
    let before = fetches();
    assert!(before >= 1, "the credentials came from the endpoint");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let (second, err) = psql("SELECT count(*) FROM t WHERE k > 10");
    assert_eq!(second, "99990", "{err}");
    assert!(fetches() > before, "credentials within 300 s of expiry were fetched again ({} fetches)", fetches());
    let _ = child.kill();
    let _ = fake.kill();
}

/// On EKS with IRSA: a web identity token file and a role, exchanged at STS
/// (a TLS fake on loopback, trusted through AWS_ALLOW_INVALID_CERTIFICATES:
/// object_store speaks only HTTPS to STS) for temporary credentials.
#[test]
fn a_web_identity_token_is_exchanged_at_sts_for_credentials() {
    let minio = blobhouse_testkit::MinioServer::shared();
    let dir = tempfile::tempdir().unwrap();
    let (mut fake, port, fetches) = fake_credentials("sts", "eks-projected-token", 3600, dir.path());
    let token_file = dir.path().join("web-identity-token");
    std::fs::write(&token_file, "eks-projected-token").unwrap();
    let env = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.display().to_string()),
        ("AWS_ROLE_ARN", "arn:aws:iam::000000000000:role/blobhouse".to_string()),
        ("AWS_ENDPOINT_URL_STS", format!("https://127.0.0.1:{port}")),
        ("AWS_ALLOW_INVALID_CERTIFICATES", "true".to_string()),
    ];
    write_and_read_with_only(&minio.fresh_url("cli-web-identity"), dir.path(), &env);
    let _ = fake.kill();
    assert!(fetches() >= 1);
}

/// Workers started with `--workers 2` reach an Azure database given only
/// as flags (`--endpoint`, `--store-option`): the coordinator hands them
/// the settings as environment variables, not on their command lines.
#[test]
fn local_workers_reach_an_azure_database_given_only_flags() {
    let azurite = AzuriteServer::shared();
    let db = azurite.fresh_url("cli-az-workers");
    let account = format!("azure_storage_account_name={ACCOUNT}");
    let key = format!("azure_storage_account_key={ACCOUNT_KEY}");
    let flags = ["--db", db.as_str(), "--endpoint", azurite.endpoint.as_str(), "--store-option", account.as_str(), "--store-option", key.as_str()];
    let sql = |more: &[&str], script: &str| {
        let mut args = vec!["sql"];
        args.extend(flags);
        args.extend(more);
        args.extend(["-c", script]);
        blobhouse(&args, &[])
    };
    ok(sql(&[], "CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 200000)"));
    let (out, err) = ok(sql(&["--workers", "2"], "SELECT count(*), sum(k) FROM t"));
    assert!(out.contains("200000") && out.contains("20000100000"), "{out}\n{err}");
    // Both workers started (they open the database first) and ran to the end.
    assert_eq!(err.matches("peak RSS").count(), 2, "{err}");
    assert!(!err.contains("warning") && !err.contains("down"), "{err}");
}
