//! SCRAM users written at format time (Kafka's `kafka-storage format --add-scram`,
//! KIP-900), so that a cluster whose inter-broker login is SCRAM starts with that user
//! and needs no step after it is up.
//!
//! `rill format --data-dir DIR --add-scram 'SCRAM-SHA-256=[name=alice,password=alice-secret]'`
//! salts each password (or takes `salt=` and `saltedpassword=`, both base64, with
//! `iterations=`, 4096 unless given) and writes only the stored credential (salt,
//! StoredKey, ServerKey, iterations) to `DIR/bootstrap.scram`, one user and mechanism a
//! line. At every start a node that finds the file submits, once the quorum has a
//! leader, an AlterUserScramCredentials event for the users and mechanisms the
//! committed image has no credential for; so the first node up writes them, the others
//! find them there, and a password changed later is never put back. Kafka writes the
//! bootstrap records into the log at its creation instead; Rill's log is created by
//! Raft's first leader, which knows nothing of the file, hence the event.

use std::path::Path;
use std::sync::Weak;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use rill_metadata::{
    AlterUserScramCredentialsRequest, ControllerEvent, MetadataQuorum, ScramCredentialUpsertion,
};

use crate::error::BrokerError;
use crate::network::scram::{random_bytes, ScramMechanism};

/// The file in the data directory.
pub const FILE: &str = "bootstrap.scram";
/// Kafka's default and least number of iterations.
const DEFAULT_ITERATIONS: i32 = 4096;
const MIN_ITERATIONS: i32 = 4096;
const MAX_ITERATIONS: i32 = 16384;
const SALT_BYTES: usize = 32;

/// Parses one `--add-scram` value and derives its stored credential.
pub fn parse_add_scram(spec: &str) -> Result<ScramCredentialUpsertion, String> {
    let bad = |why: &str| {
        format!(
            "--add-scram {spec:?}: {why} (expected MECHANISM=[name=NAME,password=PASSWORD] or \
             MECHANISM=[name=NAME,iterations=N,salt=BASE64,saltedpassword=BASE64])"
        )
    };
    let (mechanism, rest) = spec.split_once('=').ok_or_else(|| bad("no '='"))?;
    let mechanism = ScramMechanism::from_name(mechanism.trim())
        .ok_or_else(|| bad("the mechanism must be SCRAM-SHA-256 or SCRAM-SHA-512"))?;
    let body = rest
        .trim()
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or_else(|| bad("the settings must be in [...]"))?;
    let (mut name, mut password, mut iterations, mut salt, mut salted) =
        (None, None, None, None, None);
    for entry in body.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, value) = entry
            .split_once('=')
            .ok_or_else(|| bad("a setting without '='"))?;
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value)
            .to_string();
        let decode = |v: &str| {
            BASE64
                .decode(v)
                .map_err(|_| bad("salt and saltedpassword are base64"))
        };
        match key.trim() {
            "name" => name = Some(value),
            "password" => password = Some(value),
            "iterations" => {
                iterations = Some(
                    value
                        .parse::<i32>()
                        .map_err(|_| bad("iterations is a number"))?,
                )
            }
            "salt" => salt = Some(decode(&value)?),
            "saltedpassword" => salted = Some(decode(&value)?),
            other => return Err(bad(&format!("unknown setting {other:?}"))),
        }
    }
    let name = name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("no name"))?;
    if name.contains(['\n', '\r', '\t']) {
        return Err(bad("the name may not hold a tab or a line break"));
    }
    let iterations = iterations.unwrap_or(DEFAULT_ITERATIONS);
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
        return Err(bad(&format!(
            "iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}"
        )));
    }
    let (salt, salted) = match (password, salt, salted) {
        (Some(password), None, None) => {
            let salt = random_bytes(SALT_BYTES)?;
            let rounds = u32::try_from(iterations).unwrap_or(4096);
            let salted = mechanism.salted_password(password.as_bytes(), &salt, rounds);
            (salt, salted)
        }
        (None, Some(salt), Some(salted)) if !salt.is_empty() => (salt, salted),
        _ => return Err(bad("give password, or salt and saltedpassword")),
    };
    let credential = mechanism.credential(&salt, &salted, iterations);
    Ok(ScramCredentialUpsertion {
        name,
        mechanism: mechanism.kafka_type(),
        salt: credential.salt,
        stored_key: credential.stored_key,
        server_key: credential.server_key,
        iterations,
    })
}

/// Writes the credentials to `data_dir` (replacing an earlier file).
pub fn write(data_dir: &Path, users: &[ScramCredentialUpsertion]) -> Result<(), BrokerError> {
    std::fs::create_dir_all(data_dir).map_err(|e| BrokerError::io(data_dir.display(), e))?;
    let mut text = String::new();
    for u in users {
        text.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\n",
            u.mechanism,
            u.iterations,
            BASE64.encode(&u.salt),
            BASE64.encode(&u.stored_key),
            BASE64.encode(&u.server_key),
            u.name
        ));
    }
    let path = data_dir.join(FILE);
    std::fs::write(&path, text).map_err(|e| BrokerError::io(path.display(), e))
}

/// The credentials in `data_dir`'s file, none when there is no file.
pub fn read(data_dir: &Path) -> Result<Vec<ScramCredentialUpsertion>, BrokerError> {
    let path = data_dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(BrokerError::io(path.display(), e)),
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
        let bad = || {
            BrokerError::Config(format!(
                "{} line {}: not a credential written by rill format --add-scram",
                path.display(),
                i + 1
            ))
        };
        let fields: Vec<&str> = line.splitn(6, '\t').collect();
        let [mechanism, iterations, salt, stored, server, name] = fields[..] else {
            return Err(bad());
        };
        let b64 = |v: &str| BASE64.decode(v).map_err(|_| bad());
        out.push(ScramCredentialUpsertion {
            name: name.to_string(),
            mechanism: mechanism.parse().map_err(|_| bad())?,
            salt: b64(salt)?,
            stored_key: b64(stored)?,
            server_key: b64(server)?,
            iterations: iterations.parse().map_err(|_| bad())?,
        });
    }
    Ok(out)
}

/// Submits the users of `users` that the committed image lacks, retrying until the
/// quorum takes them or the quorum is gone (see the module docs).
pub async fn apply(quorum: Weak<MetadataQuorum>, users: Vec<ScramCredentialUpsertion>) {
    loop {
        let Some(q) = quorum.upgrade() else {
            return;
        };
        if q.leader_id().is_some() {
            let image = q.image();
            let missing: Vec<ScramCredentialUpsertion> = users
                .iter()
                .filter(|u| {
                    !image
                        .scram_credentials
                        .contains_key(&(u.name.clone(), u.mechanism))
                })
                .cloned()
                .collect();
            if missing.is_empty() {
                return;
            }
            let names: Vec<String> = missing.iter().map(|u| u.name.clone()).collect();
            let event =
                ControllerEvent::AlterUserScramCredentials(AlterUserScramCredentialsRequest {
                    deletions: Vec::new(),
                    upsertions: missing,
                });
            match q.submit(event, Duration::from_secs(10)).await {
                Ok(_) => {
                    tracing::info!(users = ?names, "SCRAM users from {FILE} written to the metadata log");
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "SCRAM users from {FILE} not written yet; retrying")
                }
            }
        }
        drop(q);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_give_a_credential_the_password_verifies() {
        let by_password =
            parse_add_scram("SCRAM-SHA-256=[name=alice,password=alice-secret]").unwrap();
        assert_eq!(
            (by_password.name.as_str(), by_password.mechanism),
            ("alice", 1)
        );
        assert_eq!(by_password.iterations, 4096);
        // Kafka's salted form with the same salt gives the same stored credential.
        let m = ScramMechanism::Sha256;
        let salted = m.salted_password(b"alice-secret", &by_password.salt, 4096);
        let spec = format!(
            "SCRAM-SHA-256=[name=\"alice\",iterations=4096,salt=\"{}\",saltedpassword=\"{}\"]",
            BASE64.encode(&by_password.salt),
            BASE64.encode(&salted)
        );
        let by_salt = parse_add_scram(&spec).unwrap();
        assert_eq!(by_salt, by_password);
        let other = parse_add_scram("SCRAM-SHA-256=[name=alice,password=other]").unwrap();
        assert_ne!(other.salt, by_password.salt, "a fresh salt each time");

        let sha512 = parse_add_scram("SCRAM-SHA-512=[name=b,password=p,iterations=8192]").unwrap();
        assert_eq!((sha512.mechanism, sha512.iterations), (2, 8192));
        assert_eq!(sha512.stored_key.len(), 64);
    }

    #[test]
    fn bad_specs_are_refused_with_the_reason() {
        let err = |s: &str| parse_add_scram(s).unwrap_err();
        assert!(err("SCRAM-SHA-1=[name=a,password=b]").contains("SCRAM-SHA-256 or"));
        assert!(err("SCRAM-SHA-256=name=a,password=b").contains("[...]"));
        assert!(err("SCRAM-SHA-256=[password=b]").contains("no name"));
        assert!(err("SCRAM-SHA-256=[name=a]").contains("give password"));
        assert!(err("SCRAM-SHA-256=[name=a,password=b,iterations=10]").contains("iterations"));
        assert!(err("SCRAM-SHA-256=[name=a,salt=!!,saltedpassword=x]").contains("base64"));
        assert!(err("SCRAM-SHA-256=[name=a,password=b,colour=red]").contains("colour"));
    }

    #[test]
    fn the_file_round_trips_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_empty(), "no file, no users");
        let users = vec![
            parse_add_scram("SCRAM-SHA-256=[name=alice smith,password=a]").unwrap(),
            parse_add_scram("SCRAM-SHA-512=[name=broker,password=b]").unwrap(),
        ];
        write(dir.path(), &users).unwrap();
        assert_eq!(read(dir.path()).unwrap(), users);
        std::fs::write(dir.path().join(FILE), "1\tnope\n").unwrap();
        assert!(read(dir.path()).unwrap_err().to_string().contains("line 1"));
    }
}
