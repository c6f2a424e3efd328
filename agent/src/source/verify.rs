//! Commit signature policy: with `allowed_signers_file` (git's SSH signatures, `gpg.format=ssh`)
//! or `openpgp_keyring_file` configured, a head is accepted only when its commit carries a valid
//! signature by an allowed key. Checked in-process (ssh-key's SSHSIG, rpgp), never by running
//! `ssh-keygen` or `gpg`.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use git2::{Oid, Repository};
use jiff::Timestamp;
use pgp::composed::{Deserializable, DetachedSignature, SignedPublicKey};
use pgp::types::KeyDetails;
use ssh_key::{HashAlg, PublicKey, SshSig};

use crate::types::AcceptedSignature;

/// The namespace git signs commits in.
const GIT_NAMESPACE: &str = "git";

/// Why a commit's signature was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("commit {commit} refused: {reason}{}", key.as_ref().map(|k| format!(" (key {k})")).unwrap_or_default())]
pub struct Refusal {
    pub commit: String,
    /// The key fingerprint seen, if the signature named one.
    pub key: Option<String>,
    pub reason: String,
}

/// Where the allowed keys are.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub allowed_signers: Option<PathBuf>,
    pub openpgp_keyring: Option<PathBuf>,
}

impl Policy {
    pub fn is_required(&self) -> bool {
        self.allowed_signers.is_some() || self.openpgp_keyring.is_some()
    }

    /// Checks the signature of commit `oid`.
    pub fn check(&self, repo: &Repository, oid: Oid) -> Result<AcceptedSignature, Refusal> {
        let refuse = |key: Option<String>, reason: String| Refusal {
            commit: oid.to_string(),
            key,
            reason,
        };
        let commit = repo
            .find_commit(oid)
            .map_err(|e| refuse(None, format!("cannot read it: {}", e.message())))?;
        let committed = Timestamp::from_second(commit.committer().when().seconds())
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let (signature, data) = match repo.extract_signature(&oid, None) {
            Ok(pair) => pair,
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                return Err(refuse(
                    None,
                    "it is not signed, and a signature is required".into(),
                ));
            }
            Err(e) => {
                return Err(refuse(
                    None,
                    format!("cannot read its signature: {}", e.message()),
                ));
            }
        };
        let signature = signature.as_str().unwrap_or_default().trim();
        if signature.starts_with("-----BEGIN SSH SIGNATURE-----") {
            let Some(file) = &self.allowed_signers else {
                return Err(refuse(
                    None,
                    "it carries an SSH signature but no allowed_signers_file is configured".into(),
                ));
            };
            check_ssh(file, signature, &data, committed)
                .map_err(|(key, reason)| refuse(key, reason))
        } else if signature.starts_with("-----BEGIN PGP SIGNATURE-----") {
            let Some(file) = &self.openpgp_keyring else {
                return Err(refuse(
                    None,
                    "it carries an OpenPGP signature but no openpgp_keyring_file is configured"
                        .into(),
                ));
            };
            check_openpgp(file, signature, &data).map_err(|(key, reason)| refuse(key, reason))
        } else {
            Err(refuse(
                None,
                "its signature is in a format ginx does not know (expected SSH or OpenPGP)".into(),
            ))
        }
    }
}

type Failure = (Option<String>, String);

fn check_ssh(
    file: &Path,
    armored: &str,
    data: &[u8],
    committed: Timestamp,
) -> Result<AcceptedSignature, Failure> {
    let sig = SshSig::from_pem(armored)
        .map_err(|e| (None, format!("its SSH signature cannot be parsed: {e}")))?;
    let key = PublicKey::from(sig.public_key().clone());
    let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
    let fail = |reason: String| (Some(fingerprint.clone()), reason);
    if sig.namespace() != GIT_NAMESPACE {
        return Err(fail(format!(
            "it is signed for namespace {:?}, not \"git\"",
            sig.namespace()
        )));
    }
    let text = std::fs::read_to_string(file).map_err(|e| {
        fail(format!(
            "cannot read allowed_signers_file {}: {e}",
            file.display()
        ))
    })?;
    let signers = parse_allowed_signers(&text)
        .map_err(|(line, m)| fail(format!("{}:{line}: {m}", file.display())))?;
    let mut listed_but_not_valid = None;
    let mut principal = None;
    for s in signers
        .iter()
        .filter(|s| s.key.key_data() == key.key_data())
    {
        if s.cert_authority {
            continue;
        }
        if let Some(ns) = &s.namespaces
            && !ns.iter().any(|n| n == GIT_NAMESPACE)
        {
            listed_but_not_valid = Some(format!(
                "{} lists it only for namespaces {}",
                file.display(),
                ns.join(",")
            ));
            continue;
        }
        if s.valid_after.is_some_and(|t| committed < t)
            || s.valid_before.is_some_and(|t| committed >= t)
        {
            listed_but_not_valid = Some(format!(
                "{} lists it, but not as valid at the commit time {committed}",
                file.display()
            ));
            continue;
        }
        principal = Some(s.principals.join(","));
        break;
    }
    let Some(principal) = principal else {
        return Err(fail(listed_but_not_valid.unwrap_or_else(|| {
            format!(
                "it is signed by a key that is not in allowed_signers_file {}",
                file.display()
            )
        })));
    };
    key.verify(GIT_NAMESPACE, data, &sig).map_err(|_| {
        fail("its SSH signature does not verify: the commit or the signature was altered".into())
    })?;
    Ok(AcceptedSignature {
        format: "ssh".into(),
        key: fingerprint,
        signer: principal,
    })
}

fn check_openpgp(file: &Path, armored: &str, data: &[u8]) -> Result<AcceptedSignature, Failure> {
    let (sig, _) = DetachedSignature::from_armor_single(Cursor::new(armored.as_bytes()))
        .map_err(|e| (None, format!("its OpenPGP signature cannot be parsed: {e}")))?;
    let issuer = sig
        .signature
        .issuer_fingerprint()
        .first()
        .map(|f| format!("{f:X}"))
        .or_else(|| {
            sig.signature
                .issuer_key_id()
                .first()
                .map(|k| k.as_ref().iter().map(|b| format!("{b:02X}")).collect())
        });
    let fail = |reason: String| (issuer.clone(), reason);
    let bytes = std::fs::read(file).map_err(|e| {
        fail(format!(
            "cannot read openpgp_keyring_file {}: {e}",
            file.display()
        ))
    })?;
    // Armored or binary, one key or many.
    let keys: Vec<SignedPublicKey> = SignedPublicKey::from_reader_many(Cursor::new(bytes))
        .map(|(iter, _)| iter.filter_map(Result::ok).collect())
        .map_err(|e| fail(format!("openpgp_keyring_file {}: {e}", file.display())))?;
    for key in keys.iter().filter(|k| k.verify_bindings().is_ok()) {
        let signer = key
            .details
            .users
            .first()
            .map(|u| String::from_utf8_lossy(u.id.id()).into_owned())
            .unwrap_or_default();
        if sig.verify(key, data).is_ok() {
            return Ok(AcceptedSignature {
                format: "openpgp".into(),
                key: format!("{:X}", key.fingerprint()),
                signer,
            });
        }
        for sub in key
            .public_subkeys
            .iter()
            .filter(|s| s.verify_bindings(key).is_ok())
        {
            if sig.verify(sub, data).is_ok() {
                return Ok(AcceptedSignature {
                    format: "openpgp".into(),
                    key: format!("{:X}", sub.fingerprint()),
                    signer,
                });
            }
        }
    }
    Err(fail(format!(
        "its OpenPGP signature is not by a key in openpgp_keyring_file {}, or does not verify",
        file.display()
    )))
}

/// One line of an allowed-signers file.
#[derive(Debug)]
pub struct AllowedSigner {
    pub principals: Vec<String>,
    pub cert_authority: bool,
    pub namespaces: Option<Vec<String>>,
    pub valid_after: Option<Timestamp>,
    pub valid_before: Option<Timestamp>,
    pub key: PublicKey,
}

/// Parses git's allowed-signers format (ssh-keygen(1), ALLOWED SIGNERS):
/// `principals [options] keytype base64-key [comment]`.
pub fn parse_allowed_signers(text: &str) -> Result<Vec<AllowedSigner>, (usize, String)> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |m: String| (i + 1, m);
        let mut fields = split_fields(line).into_iter();
        let principals = fields.next().ok_or_else(|| at("empty line".into()))?;
        let mut next = fields.next().ok_or_else(|| at("no key".into()))?;
        let (mut cert_authority, mut namespaces, mut valid_after, mut valid_before) =
            (false, None, None, None);
        if !looks_like_key_type(&next) {
            for option in split_options(&next) {
                let (name, value) = option.split_once('=').unwrap_or((option.as_str(), ""));
                let value = value.trim_matches('"');
                match name.to_ascii_lowercase().as_str() {
                    "cert-authority" => cert_authority = true,
                    "namespaces" => {
                        namespaces = Some(value.split(',').map(str::to_owned).collect())
                    }
                    "valid-after" => valid_after = Some(parse_time(value).map_err(at)?),
                    "valid-before" => valid_before = Some(parse_time(value).map_err(at)?),
                    other => return Err(at(format!("unknown option {other:?}"))),
                }
            }
            next = fields.next().ok_or_else(|| at("no key type".into()))?;
        }
        let blob = fields.next().ok_or_else(|| at("no key".into()))?;
        let key = PublicKey::from_openssh(&format!("{next} {blob}"))
            .map_err(|e| at(format!("cannot read the key: {e}")))?;
        let signer = AllowedSigner {
            principals: principals
                .trim_matches('"')
                .split(',')
                .map(str::to_owned)
                .collect(),
            cert_authority,
            namespaces,
            valid_after,
            valid_before,
            key,
        };
        out.push(signer);
    }
    Ok(out)
}

fn looks_like_key_type(s: &str) -> bool {
    s.starts_with("ssh-")
        || s.starts_with("ecdsa-")
        || s.starts_with("sk-")
        || s.starts_with("rsa-")
}

/// Splits on whitespace outside double quotes.
fn split_fields(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    fields.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        fields.push(cur);
    }
    fields
}

/// Splits an option list on commas outside double quotes.
fn split_options(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// `YYYYMMDD[HHMM[SS]][Z]`, taken as UTC.
fn parse_time(s: &str) -> Result<Timestamp, String> {
    let digits = s.trim_end_matches(['Z', 'z']);
    let padded = match digits.len() {
        8 => format!("{digits}000000"),
        12 => format!("{digits}00"),
        14 => digits.to_owned(),
        _ => return Err(format!("invalid time {s:?}; expected YYYYMMDD[HHMM[SS]]")),
    };
    jiff::civil::DateTime::strptime("%Y%m%d%H%M%S", &padded)
        .and_then(|dt| dt.to_zoned(jiff::tz::TimeZone::UTC))
        .map(|z| z.timestamp())
        .map_err(|e| format!("invalid time {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHTJ2ZdvRmi0nPZxYZlR2jDRdFDg/rTkNRoHzwNh7Rbf";

    #[test]
    fn parses_principals_options_and_keys() {
        let text = format!(
            "# team\nalice@example.com,bob@example.com namespaces=\"git,file\",valid-after=\"20260101\" {KEY} alice\n\
             carol@example.com {KEY}\n"
        );
        let s = parse_allowed_signers(&text).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].principals, ["alice@example.com", "bob@example.com"]);
        assert_eq!(
            s[0].namespaces.as_deref(),
            Some(&["git".to_owned(), "file".to_owned()][..])
        );
        assert_eq!(
            s[0].valid_after,
            Some("2026-01-01T00:00:00Z".parse().unwrap())
        );
        assert!(s[1].namespaces.is_none());
    }

    #[test]
    fn bad_lines_name_their_number() {
        let e = parse_allowed_signers(&format!("ok@x {KEY}\nbad@x bogus=1 {KEY}\n")).unwrap_err();
        assert_eq!(e.0, 2);
        assert!(e.1.contains("unknown option"));
        let e = parse_allowed_signers("x@y ssh-ed25519 notbase64\n").unwrap_err();
        assert_eq!(e.0, 1);
    }

    #[test]
    fn times() {
        assert_eq!(
            parse_time("20260102").unwrap(),
            "2026-01-02T00:00:00Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(
            parse_time("202601021530Z").unwrap(),
            "2026-01-02T15:30:00Z".parse::<Timestamp>().unwrap()
        );
        assert!(parse_time("2026").is_err());
    }
}
