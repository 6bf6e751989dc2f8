//! JSON over HTTP against a running service (awc: the actix client, so it needs an actix or
//! tokio-local runtime, such as `#[actix_rt::test]`). The demo drives its story with it too.

use anyhow::Context as _;
use awc::http::Method;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;

/// One service's base address and, when it wants one, the bearer token for writes.
#[derive(Clone)]
pub struct Api {
    client: awc::Client,
    base: String,
    token: Option<String>,
    /// Sent with every request (a `traceparent`, …).
    headers: Vec<(String, String)>,
}

/// An answer: status and the JSON body (`Value::Null` when it had none).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    /// `body[field]` as a string (`aggregate_id`, `error`, …), empty when absent.
    pub fn text(&self, field: &str) -> String {
        self.body[field].as_str().unwrap_or_default().to_owned()
    }

    /// `body[field]` as an integer (`version`, …).
    pub fn int(&self, field: &str) -> Option<i64> {
        self.body[field].as_i64()
    }
}

impl Api {
    pub fn new(addr: SocketAddr, token: Option<String>) -> Self {
        Self {
            client: awc::Client::builder()
                .timeout(Duration::from_secs(30))
                .finish(),
            base: format!("http://{addr}"),
            token,
            headers: Vec::new(),
        }
    }

    /// `http://<address>`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// This API sending `name: value` with every request as well.
    pub fn with_header(&self, name: &str, value: &str) -> Self {
        let mut api = self.clone();
        api.headers.push((name.to_string(), value.to_string()));
        api
    }

    pub fn without_token(&self) -> Self {
        Self {
            token: None,
            ..self.clone()
        }
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Reply> {
        self.send(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Reply> {
        self.send(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Option<&Value>) -> anyhow::Result<Reply> {
        self.send(Method::PUT, path, body).await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> anyhow::Result<Reply> {
        self.send(Method::PATCH, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<Reply> {
        self.send(Method::DELETE, path, None).await
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Reply> {
        match body {
            Some(body) => {
                self.send_raw(method, path, "application/json", &body.to_string())
                    .await
            }
            None => self.send_raw(method, path, "", "").await,
        }
    }

    /// Sends `body` as is (malformed JSON, other content types).
    pub async fn send_raw(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: &str,
    ) -> anyhow::Result<Reply> {
        let (status, bytes) = self
            .exchange(method.clone(), path, content_type, body)
            .await?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{method} {}{path}: body is not JSON: {}",
                    self.base,
                    String::from_utf8_lossy(&bytes)
                )
            })?
        };
        Ok(Reply { status, body })
    }

    /// GETs `path` as text (`/metrics`, …): its status and body.
    pub async fn get_text(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let (status, bytes) = self.exchange(Method::GET, path, "", "").await?;
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// One request: its status and body (at most 1 MiB).
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: &str,
    ) -> anyhow::Result<(u16, bytes::Bytes)> {
        let url = format!("{}{path}", self.base);
        let mut request = self.client.request(method.clone(), &url);
        if let Some(token) = &self.token {
            request = request.insert_header(("Authorization", format!("Bearer {token}")));
        }
        if !content_type.is_empty() {
            request = request.insert_header(("Content-Type", content_type));
        }
        for (name, value) in &self.headers {
            request = request.insert_header((name.as_str(), value.as_str()));
        }
        let mut response = request
            .send_body(body.to_owned())
            .await
            .map_err(|e| anyhow::anyhow!("{method} {url}: {e}"))?;
        let bytes = response
            .body()
            .limit(1 << 20)
            .await
            .map_err(|e| anyhow::anyhow!("{method} {url}: reading the body: {e}"))?;
        Ok((response.status().as_u16(), bytes))
    }
}
