//! AWS KMS as a key provider: the database key is wrapped and unwrapped by
//! KMS's `Encrypt` and `Decrypt` (JSON over HTTPS, signed with Signature
//! Version 4), so the master key never leaves KMS.
//!
//! Why by hand: the AWS SDK's KMS client brings the SDK's runtime, some
//! forty crates and a C build (aws-lc), for two calls; object_store, already
//! here, supplies the credential chain and ring the HMAC. KMS is asked only
//! when a database is created, opened or its key rotated — never per
//! object.

use std::time::Duration;

use base64::Engine as _;
use object_store::aws::{AmazonS3Builder, AwsCredentialProvider};
use ring::digest::{SHA256, digest};
use ring::hmac;

use super::hex;
use super::provider::{KeyError, KeyProvider};

/// How long one KMS call may take.
const TIMEOUT: Duration = Duration::from_secs(20);

/// A symmetric KMS key.
#[derive(Debug)]
pub struct AwsKms {
    key_id: String,
    endpoint: String,
    region: String,
    credentials: AwsCredentialProvider,
    client: reqwest::Client,
}

impl AwsKms {
    /// The KMS key `key_id` (id, ARN or `alias/…`) at `endpoint` (default:
    /// `AWS_ENDPOINT_URL_KMS`, else the region's public endpoint).
    pub fn new(key_id: &str, endpoint: Option<&str>, region: Option<&str>) -> Result<AwsKms, KeyError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let region = region.map(str::to_string).or_else(|| env("AWS_REGION")).or_else(|| env("AWS_DEFAULT_REGION")).unwrap_or_else(|| "us-east-1".into());
        let endpoint = endpoint.map(str::to_string).or_else(|| env("AWS_ENDPOINT_URL_KMS")).unwrap_or_else(|| format!("https://kms.{region}.amazonaws.com"));
        let kms = |reason: String| KeyError::Kms(format!("AWS KMS key {key_id} at {endpoint}: {reason}"));
        // object_store's AWS credential chain, with blobhouse's profiles
        // (crate::credentials): built for a bucket that is never asked.
        let mut builder = AmazonS3Builder::from_env().with_bucket_name("blobhouse-kms").with_region(&region);
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_none()
            && let Some(profile) = crate::credentials::profile().map_err(kms)?
            && let Some(provider) = crate::credentials::provider(&profile)
        {
            builder = builder.with_credentials(provider);
        }
        let credentials = builder.build().map_err(|e| kms(format!("no AWS credentials ({e})")))?.credentials().clone();
        let client = reqwest::Client::builder().timeout(TIMEOUT).build().map_err(|e| kms(e.to_string()))?;
        Ok(AwsKms { key_id: key_id.to_string(), endpoint: endpoint.trim_end_matches('/').to_string(), region, credentials, client })
    }

    /// Calls `TrentService.<action>` with `body`; returns the reply's JSON.
    async fn call(&self, action: &str, body: serde_json::Value) -> Result<serde_json::Value, KeyError> {
        let fail = |reason: String| KeyError::Kms(format!("AWS KMS {action} with key {} at {} failed: {reason}", self.key_id, self.endpoint));
        let credential = self.credentials.get_credential().await.map_err(|e| fail(format!("no AWS credentials ({e}); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run where a role is attached")))?;
        let url = reqwest::Url::parse(&format!("{}/", self.endpoint)).map_err(|e| fail(format!("bad endpoint ({e})")))?;
        let host = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            _ => return Err(fail("the endpoint has no host".into())),
        };
        let payload = serde_json::to_vec(&body).expect("JSON serialises");
        let target = format!("TrentService.{action}");
        let now = chrono::DateTime::<chrono::Utc>::from(std::time::SystemTime::now());
        let headers = sign(&SignRequest {
            host: &host,
            region: &self.region,
            target: &target,
            payload: &payload,
            amz_date: &now.format("%Y%m%dT%H%M%SZ").to_string(),
            key_id: &credential.key_id,
            secret: &credential.secret_key,
            token: credential.token.as_deref(),
        });
        let mut request = self.client.post(url).body(payload);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(|e| fail(format!("{e} (is the endpoint right? AWS_ENDPOINT_URL_KMS or --kms-endpoint)")))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| fail(e.to_string()))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|_| fail(format!("HTTP {status}: {}", text.chars().take(200).collect::<String>())))?;
        if !status.is_success() {
            let kind = json["__type"].as_str().unwrap_or("error").rsplit('#').next().unwrap_or_default().to_string();
            let message = json["message"].as_str().or(json["Message"].as_str()).unwrap_or_default();
            return Err(fail(format!("{kind}: {message} (HTTP {status})")));
        }
        Ok(json)
    }
}

#[async_trait::async_trait]
impl KeyProvider for AwsKms {
    fn key_id(&self) -> String {
        format!("aws-kms:{}", self.key_id)
    }

    fn kind(&self) -> &'static str {
        "aws-kms"
    }

    async fn wrap(&self, key: &[u8], context: &str) -> Result<Vec<u8>, KeyError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let reply = self.call("Encrypt", serde_json::json!({ "KeyId": self.key_id, "Plaintext": b64.encode(key), "EncryptionContext": { "blobhouse-database": context } })).await?;
        let blob = reply["CiphertextBlob"].as_str().ok_or_else(|| KeyError::Kms("AWS KMS Encrypt replied without a CiphertextBlob".into()))?;
        b64.decode(blob).map_err(|e| KeyError::Kms(format!("AWS KMS Encrypt replied with a CiphertextBlob that is not base64 ({e})")))
    }

    async fn unwrap(&self, wrapped: &[u8], context: &str) -> Result<Vec<u8>, KeyError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let reply = self
            .call("Decrypt", serde_json::json!({ "KeyId": self.key_id, "CiphertextBlob": b64.encode(wrapped), "EncryptionContext": { "blobhouse-database": context } }))
            .await
            .map_err(|e| match e {
                KeyError::Kms(m) if m.contains("InvalidCiphertextException") || m.contains("IncorrectKeyException") => KeyError::WrongKey { key_id: self.key_id() },
                e => e,
            })?;
        let plain = reply["Plaintext"].as_str().ok_or_else(|| KeyError::Kms("AWS KMS Decrypt replied without a Plaintext".into()))?;
        b64.decode(plain).map_err(|e| KeyError::Kms(format!("AWS KMS Decrypt replied with a Plaintext that is not base64 ({e})")))
    }
}

/// What a KMS request's signature covers.
struct SignRequest<'a> {
    host: &'a str,
    region: &'a str,
    target: &'a str,
    payload: &'a [u8],
    /// `YYYYMMDDTHHMMSSZ`.
    amz_date: &'a str,
    key_id: &'a str,
    secret: &'a str,
    token: Option<&'a str>,
}

/// The headers of a KMS request signed with AWS Signature Version 4
/// (`POST /`, JSON 1.1): content type, target, date, token and
/// `Authorization`.
fn sign(r: &SignRequest) -> Vec<(&'static str, String)> {
    let date = &r.amz_date[..8];
    let mut headers = vec![
        ("content-type", "application/x-amz-json-1.1".to_string()),
        ("host", r.host.to_string()),
        ("x-amz-date", r.amz_date.to_string()),
    ];
    if let Some(token) = r.token {
        headers.push(("x-amz-security-token", token.to_string()));
    }
    headers.push(("x-amz-target", r.target.to_string()));
    let signed: Vec<&str> = headers.iter().map(|(n, _)| *n).collect();
    let canonical_headers: String = headers.iter().map(|(n, v)| format!("{n}:{}\n", v.trim())).collect();
    let canonical = format!("POST\n/\n\n{canonical_headers}\n{}\n{}", signed.join(";"), hex(digest(&SHA256, r.payload).as_ref()));
    let scope = format!("{date}/{}/kms/aws4_request", r.region);
    let to_sign = format!("AWS4-HMAC-SHA256\n{}\n{scope}\n{}", r.amz_date, hex(digest(&SHA256, canonical.as_bytes()).as_ref()));
    let step = |key: &[u8], data: &str| hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes());
    let k_date = step(format!("AWS4{}", r.secret).as_bytes(), date);
    let k_region = step(k_date.as_ref(), r.region);
    let k_service = step(k_region.as_ref(), "kms");
    let k_signing = step(k_service.as_ref(), "aws4_request");
    let signature = hex(step(k_signing.as_ref(), &to_sign).as_ref());
    let authorization = format!("AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={}, Signature={signature}", r.key_id, signed.join(";"));
    headers.retain(|(n, _)| *n != "host");
    headers.push(("authorization", authorization));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same request signed by botocore's `SigV4Auth` (the AWS SDK for
    /// Python, an independent implementation) at the same instant gives
    /// this signature.
    #[test]
    fn the_signature_follows_signature_version_4() {
        let headers = sign(&SignRequest {
            host: "kms.us-east-1.amazonaws.com",
            region: "us-east-1",
            target: "TrentService.Encrypt",
            payload: br#"{"KeyId":"alias/x"}"#,
            amz_date: "20261128T040000Z",
            key_id: "AKIDEXAMPLE",
            secret: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            token: None,
        });
        let auth = &headers.iter().find(|(n, _)| *n == "authorization").unwrap().1;
        assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261128/us-east-1/kms/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature="), "{auth}");
        assert_eq!(auth.rsplit('=').next().unwrap(), EXPECTED_SIGNATURE);
    }

    const EXPECTED_SIGNATURE: &str = "19b27bba690e7fbfaa35187442fc4329f08f73d20e347b4b887d8eaf6c2a67f7";
}
