//! Test certificates: a CA and the leaves it signs, as PEM files in a
//! temporary directory (rcgen), for the TLS tests.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

/// Valid from a day ago for 30 days.
pub const FRESH: (i64, i64) = (-1, 30);

/// A CA and what it signed, written as PEM files in a directory.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        Pki {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A CA named `name` (`name.pem`), and a certificate it signed for
    /// each of `leaves` (name, subject alternative names, validity in days
    /// from now: start, end), as `leaf.pem` and `leaf.key`.
    pub fn ca(&self, name: &str, leaves: &[(&str, &[&str], (i64, i64))]) {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} CA"));
        let ca = params.self_signed(&ca_key).unwrap();
        self.write(&format!("{name}.pem"), &ca.pem());
        for (leaf, names, (from, to)) in leaves {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, leaf.to_string());
            let day = time_days(*from);
            params.not_before = day;
            params.not_after = time_days(*to);
            let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
            self.write(&format!("{leaf}.pem"), &cert.pem());
            self.write(&format!("{leaf}.key"), &key.serialize_pem());
        }
    }
}

/// Now plus `days` (negative: before).
fn time_days(days: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() + time::Duration::days(days)
}
