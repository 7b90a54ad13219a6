//! Generates the environment's key material with the `openssl` CLI: a CA, the apiserver's serving
//! certificate (for 127.0.0.1 / localhost) and the service-account signing key. File I/O and
//! subprocesses only.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// Paths of the generated PEM files, all inside one folder.
#[derive(Debug, Clone)]
pub struct Certs {
    /// CA certificate that signed the serving certificate (the kubeconfig trusts it).
    pub ca_cert: PathBuf,
    /// CA private key (kube-controller-manager can sign with it).
    pub ca_key: PathBuf,
    /// apiserver serving certificate.
    pub server_cert: PathBuf,
    /// apiserver serving key.
    pub server_key: PathBuf,
    /// RSA private key that signs service-account tokens.
    pub sa_key: PathBuf,
    /// Public half of `sa_key`, for `--service-account-key-file`.
    pub sa_pub: PathBuf,
}

/// Creates all key material in `dir`.
///
/// # Errors
/// [`Error::Command`] when `openssl` is missing or fails, [`Error::Io`] when `dir` is not writable.
pub fn generate(dir: &Path) -> Result<Certs, Error> {
    let certs = Certs {
        ca_cert: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        server_cert: dir.join("apiserver.crt"),
        server_key: dir.join("apiserver.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
    };
    let csr = dir.join("apiserver.csr");
    let ext = dir.join("apiserver.ext");
    // rustls (webpki) insists on a SAN matching the URL host and on serverAuth usage.
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes.default.svc\n\
         basicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth,clientAuth\n",
    )
    .map_err(|source| Error::Io {
        action: "write",
        path: ext.clone(),
        source,
    })?;

    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "3650",
        "-subj",
        "/CN=aliaslb-testenv-ca",
        "-keyout",
        p(&certs.ca_key),
        "-out",
        p(&certs.ca_cert),
    ])?;
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=kube-apiserver",
        "-keyout",
        p(&certs.server_key),
        "-out",
        p(&csr),
    ])?;
    openssl(&[
        "x509",
        "-req",
        "-days",
        "3650",
        "-in",
        p(&csr),
        "-CA",
        p(&certs.ca_cert),
        "-CAkey",
        p(&certs.ca_key),
        "-CAcreateserial",
        "-extfile",
        p(&ext),
        "-out",
        p(&certs.server_cert),
    ])?;
    openssl(&["genrsa", "-out", p(&certs.sa_key), "2048"])?;
    openssl(&[
        "rsa",
        "-in",
        p(&certs.sa_key),
        "-pubout",
        "-out",
        p(&certs.sa_pub),
    ])?;
    Ok(certs)
}

/// Paths here are made by us from a UTF-8 temp dir name; a lossy view is exact.
fn p(path: &Path) -> &str {
    path.to_str().unwrap_or_default()
}

fn openssl(args: &[&str]) -> Result<(), Error> {
    let command = format!("openssl {}", args.join(" "));
    let out = Command::new("openssl")
        .args(args)
        .output()
        .map_err(|e| Error::Command {
            command: command.clone(),
            detail: format!("{e} (is openssl installed? scripts/test installs it)"),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            command,
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}
