//! PostgreSQL connection strings (libpq's URL and key=value forms): the TLS settings in them.
//!
//! tokio-postgres parses the strings but knows only `sslmode` `disable`, `prefer` and
//! `require`, and no `sslrootcert`; a Supabase or Cloud SQL URL often carries
//! `sslmode=verify-full&sslrootcert=…`. Those two are taken out here and resolved with the
//! `database.sslmode` / `database.ssl_root_cert` settings; `db::tls` builds the connector.

use std::path::PathBuf;
use std::str::FromStr;

/// libpq's `sslmode`: how much TLS a connection insists on (see `db::tls` for each mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    Disable,
    /// libpq's default: encrypted when the server offers it.
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub const NAMES: &'static str = "disable, prefer, require, verify-ca or verify-full";

    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SslMode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ]
        .into_iter()
        .find(|mode| mode.name() == text)
        .ok_or_else(|| format!("sslmode {text:?} is not one of {}", SslMode::NAMES))
    }
}

/// What a connection does about TLS, from a connection string and the settings beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// PEM file of the trusted CA certificates; the system's roots when `None`.
    pub root_cert: Option<PathBuf>,
}

/// Takes the TLS parameters out of `url` and merges them with the configured `sslmode` and
/// `root_cert`: a parameter may be given in either place, and a disagreement is an error
/// (which of the two was meant cannot be guessed). As in libpq, `require` with a root
/// certificate verifies the chain (`verify-ca`). Returns the string tokio-postgres can parse.
pub fn resolve_tls(
    url: &str,
    sslmode: Option<SslMode>,
    root_cert: Option<&PathBuf>,
) -> Result<(String, TlsSettings), String> {
    let (rest, params) = split_tls_params(url);
    let in_url = params
        .sslmode
        .as_deref()
        .map(SslMode::from_str)
        .transpose()?;
    let mode = match (sslmode, in_url) {
        (Some(set), Some(url)) if set != url => {
            return Err(format!(
                "sslmode {set} disagrees with sslmode={url} in the connection string"
            ))
        }
        (set, url) => set.or(url).unwrap_or_default(),
    };
    let url_root = params.sslrootcert.map(PathBuf::from);
    let root_cert = match (root_cert, url_root) {
        (Some(set), Some(url)) if *set != url => {
            return Err(format!(
                "ssl_root_cert {} disagrees with sslrootcert={} in the connection string",
                set.display(),
                url.display()
            ))
        }
        (set, url) => set.cloned().or(url),
    };
    let mode = match (mode, &root_cert) {
        (SslMode::Require, Some(_)) => SslMode::VerifyCa,
        (mode, _) => mode,
    };
    Ok((rest, TlsSettings { mode, root_cert }))
}

/// libpq's TLS parameters found in a connection string.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TlsParams {
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
}

/// The TLS parameters tokio-postgres cannot parse, removed from `url` (URL or key=value
/// form); the rest of the string is returned unchanged.
pub fn split_tls_params(url: &str) -> (String, TlsParams) {
    if url.contains("://") {
        split_url_form(url)
    } else {
        split_key_value_form(url)
    }
}

fn is_tls_param(key: &str) -> bool {
    matches!(key, "sslmode" | "sslrootcert")
}

fn set_param(params: &mut TlsParams, key: &str, value: String) {
    match key {
        "sslmode" => params.sslmode = Some(value),
        _ => params.sslrootcert = Some(value),
    }
}

fn split_url_form(url: &str) -> (String, TlsParams) {
    let mut params = TlsParams::default();
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), params);
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if !is_tls_param(key) {
                return true;
            }
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8_lossy()
                .into_owned();
            set_param(&mut params, key, value);
            false
        })
        .collect();
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (rest, params)
}

/// `key=value` pairs separated by whitespace; a value may be single-quoted with `\'` and `\\`
/// escapes, as libpq writes them.
fn split_key_value_form(url: &str) -> (String, TlsParams) {
    let mut params = TlsParams::default();
    let mut kept = Vec::new();
    let mut rest = url.trim_start();
    while !rest.is_empty() {
        let Some(eq) = rest.find('=') else {
            // Not a pair: leave it for tokio-postgres to report.
            kept.push(rest.to_string());
            break;
        };
        let key = rest[..eq].trim();
        let after = rest[eq + 1..].trim_start();
        let (value, raw_len) = read_value(after);
        let raw_end = rest.len() - after.len() + raw_len;
        if is_tls_param(key) {
            set_param(&mut params, key, value);
        } else {
            kept.push(rest[..raw_end].to_string());
        }
        rest = rest[raw_end..].trim_start();
    }
    (kept.join(" "), params)
}

/// The value at the start of `text` and how many bytes of `text` it took.
fn read_value(text: &str) -> (String, usize) {
    if let Some(quoted) = text.strip_prefix('\'') {
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(escaped);
                    }
                }
                '\'' => return (value, i + 2),
                c => value.push(c),
            }
        }
        (value, text.len())
    } else {
        let end = text.find(char::is_whitespace).unwrap_or(text.len());
        (text[..end].to_string(), end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(mode: &str, root: &str) -> TlsParams {
        TlsParams {
            sslmode: Some(mode.into()),
            sslrootcert: (!root.is_empty()).then(|| root.into()),
        }
    }

    #[test]
    fn url_form_loses_only_the_tls_parameters() {
        let (rest, found) = split_tls_params(
            "postgres://u:p@db:5432/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p@db:5432/app?application_name=x");
        assert_eq!(found, params("verify-full", "/etc/ca.pem"));
        let (rest, found) = split_tls_params("postgres://u@db/app?sslmode=require");
        assert_eq!(rest, "postgres://u@db/app");
        assert_eq!(found, params("require", ""));
        let (rest, found) = split_tls_params("postgres://u@db/app");
        assert_eq!(
            (rest.as_str(), found),
            ("postgres://u@db/app", TlsParams::default())
        );
    }

    #[test]
    fn key_value_form_loses_only_the_tls_parameters() {
        let (rest, found) = split_tls_params(
            "host=db sslmode = verify-ca user=u sslrootcert='/a dir/ca\\'s.pem' password='x y'",
        );
        assert_eq!(rest, "host=db user=u password='x y'");
        assert_eq!(found, params("verify-ca", "/a dir/ca's.pem"));
    }

    #[test]
    fn settings_and_string_must_agree_and_require_with_a_root_verifies() {
        let root = PathBuf::from("/ca.pem");
        let (_, tls) = resolve_tls("host=h", None, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tls.mode, SslMode::Prefer);
        let (_, tls) = resolve_tls("postgres://h/db?sslmode=require", None, Some(&root))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tls.mode, SslMode::VerifyCa);
        let (_, tls) = resolve_tls(
            "host=h sslmode=verify-full",
            Some(SslMode::VerifyFull),
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((tls.mode, tls.root_cert), (SslMode::VerifyFull, None));
        let conflict = resolve_tls("host=h sslmode=disable", Some(SslMode::Require), None);
        assert!(conflict.is_err_and(|e| e.contains("disagrees")));
        let unknown = resolve_tls("host=h sslmode=verify", None, None);
        assert!(unknown.is_err_and(|e| e.contains("verify-full")));
    }
}
