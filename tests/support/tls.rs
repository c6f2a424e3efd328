//! A test certificate authority: a CA written to a PEM file (for `SSL_CERT_FILE` or a
//! kubeconfig) and server certificates for 127.0.0.1 signed by it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate, PEM.
    pub pem_path: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "ginx test CA");
        let key = KeyPair::generate().unwrap();
        super::sweep::secret_pem("CA private key", &key.serialize_pem());
        let issuer = CertifiedIssuer::self_signed(params, key).unwrap();
        let pem_path = dir.join("test-ca.pem");
        std::fs::write(&pem_path, issuer.pem()).unwrap();
        Self { issuer, pem_path }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate and key for `names` (DNS names or IP addresses), signed by this CA.
    pub fn issue(&self, names: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().unwrap();
        super::sweep::secret_pem("TLS server private key", &key.serialize_pem());
        let params =
            CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (
            cert.der().clone(),
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
    }

    /// The CA certificate, DER.
    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A client certificate for `common_name` in the groups `organizations` (how the API
    /// server reads a certificate: CN the user, O the groups) and its key, both PEM.
    pub fn issue_client_pem(&self, common_name: &str, organizations: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        super::sweep::secret_pem("client certificate key (kubeconfig)", &key.serialize_pem());
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        for o in organizations {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A serving certificate for `names` (DNS names or IP addresses) and its key, both PEM.
    pub fn issue_server_pem(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        super::sweep::secret_pem("TLS server private key", &key.serialize_pem());
        let mut params =
            CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A certificate for `names` that serves and is also a client's, as kubeadm issues etcd's
    /// `server.crt`: etcd's JSON gateway dials the member's own TLS port with it.
    pub fn issue_server_and_client_pem(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        super::sweep::secret_pem("TLS server private key", &key.serialize_pem());
        let mut params =
            CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// The CA's private key, PEM (a control plane's CSR signer needs it).
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A rustls server configuration for 127.0.0.1 and localhost.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server_config_for(&["127.0.0.1", "localhost"], false)
    }

    /// A rustls server configuration with a certificate for `names`. With `client_certs`,
    /// clients may present a certificate signed by this CA (verified when presented; clients
    /// without one are accepted too, as an API server accepts bearer tokens).
    pub fn server_config_for(
        &self,
        names: &[&str],
        client_certs: bool,
    ) -> Arc<rustls::ServerConfig> {
        let (cert, key) = self.issue(names);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if client_certs {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.der()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        Arc::new(
            builder
                .with_single_cert(vec![cert, self.der()], key)
                .unwrap(),
        )
    }
}
