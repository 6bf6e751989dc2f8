//! TLS to PostgreSQL, with libpq's `sslmode` and `sslrootcert` meanings.
//!
//! tokio-postgres understands only `disable`, `prefer` and `require`, never verifies a
//! certificate itself, and rejects `verify-ca`, `verify-full` and `sslrootcert` in a connection
//! string. So both are taken out of the string here (`split_tls_params`) and turned into a
//! rustls connector ([`connector`]) that does what libpq does for each mode:
//!
//! | mode          | encrypted                     | certificate checked                   |
//! |---------------|-------------------------------|---------------------------------------|
//! | `disable`     | no                            | –                                     |
//! | `prefer`      | when the server offers it     | no                                    |
//! | `require`     | yes                           | no (yes, like `verify-ca`, with a root certificate, as libpq does) |
//! | `verify-ca`   | yes                           | signed by a trusted root              |
//! | `verify-full` | yes                           | signed by a trusted root and naming the host |
//!
//! Trusted roots are the PEM file `ssl_root_cert` names, or the system's when none is named.

use crate::conninfo::SslMode;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The connector every Courier connection uses; with `sslmode=disable` it is never asked.
pub type Tls = MakeRustlsConnect;

/// The stream of a connection made with [`Tls`].
pub type TlsStream = <Tls as tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>>::Stream;

/// Why TLS could not be set up; names the setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("ssl root certificate {path}: {reason}")]
    RootCert { path: PathBuf, reason: String },
    #[error("no trusted root certificates for sslmode={mode}: the system has none; name a PEM file in database.ssl_root_cert")]
    NoSystemRoots { mode: SslMode },
    #[error("tls setup failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// What tokio-postgres is told: it negotiates TLS, the connector decides what is trusted.
pub fn driver_mode(mode: SslMode) -> tokio_postgres::config::SslMode {
    match mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    }
}

/// The rustls connector for `mode`, trusting `root_cert` (or the system's roots).
pub fn connector(mode: SslMode, root_cert: Option<&Path>) -> Result<Tls, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => Arc::new(EncryptOnly { provider }),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(trusted_roots(mode, root_cert)?);
            let chain_and_name = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
            if mode == SslMode::VerifyFull {
                chain_and_name
            } else {
                Arc::new(ChainOnly(chain_and_name))
            }
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

fn trusted_roots(mode: SslMode, root_cert: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    match root_cert {
        Some(path) => {
            let unreadable = |reason: String| TlsError::RootCert {
                path: path.to_path_buf(),
                reason,
            };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| unreadable(e.to_string()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| unreadable(e.to_string()))?;
            if certs.is_empty() {
                return Err(unreadable("holds no PEM certificate".into()));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| unreadable(format!("not a usable CA certificate: {e}")))?;
            }
        }
        None => {
            // Read once per process, not at every (re)connect of a dedicated connection. A
            // named file is read each time: it may be rotated.
            static SYSTEM_ROOTS: OnceLock<RootCertStore> = OnceLock::new();
            roots = SYSTEM_ROOTS
                .get_or_init(|| {
                    let mut system = RootCertStore::empty();
                    // Unreadable system certificates are skipped, as every TLS client does.
                    system
                        .add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
                    system
                })
                .clone();
            if roots.is_empty() {
                return Err(TlsError::NoSystemRoots { mode });
            }
        }
    }
    Ok(roots)
}

/// `prefer` and `require`: the connection is encrypted and the handshake's signatures are
/// checked, but the certificate is not (libpq's meaning; it stops passive eavesdropping, not
/// an active man in the middle: that takes `verify-full`).
#[derive(Debug)]
struct EncryptOnly {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the host name is not compared. The
/// web-PKI verifier checks the chain before the name, so a name mismatch means the chain held.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifying_modes_need_a_readable_root_certificate() {
        let missing = connector(SslMode::VerifyFull, Some(Path::new("/nonexistent/ca.pem")));
        let error = missing.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("/nonexistent/ca.pem"), "{error}");
        assert!(connector(SslMode::Require, None).is_ok());
        assert!(connector(SslMode::Disable, None).is_ok());
    }
}
