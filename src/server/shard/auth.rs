//! Optional authentication, as memcached offers it: SASL PLAIN over the binary protocol against
//! a password file of `user:password` lines (`--sasl-password-file`, the format of memcached's
//! SASL password database). With it on, a connection must authenticate before any command but
//! VERSION and the SASL commands themselves.
//!
//! Guessing is made slow. Per connection: the reply to each failed attempt is held back
//! [`AUTH_FAILURE_DELAY`] (the connection's task waits on a timer; the shard serves its other
//! connections meanwhile), and the [`AUTH_FAILURES_MAX`]th failure closes the connection.
//! (memcached does neither: 20,000 wrong passwords took 0.41 s on one connection.) Per source
//! address, over all its connections and shards: a budget of failures (`auth_gate.rs`), past
//! which every attempt from that source, right or wrong, waits for its turn.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

/// The one mechanism offered.
pub const MECHANISMS: &str = "PLAIN";
/// Failed authentications one connection may make: the reply to the last is followed by a
/// close (counted in STAT `auth_closed`).
pub const AUTH_FAILURES_MAX: u32 = 3;
/// How long the reply to a failed authentication is held back.
pub const AUTH_FAILURE_DELAY: Duration = Duration::from_millis(100);

/// Runs the per-connection policy after a failed authentication on a connection that had
/// failed `failures` times before: holds the connection back [`AUTH_FAILURE_DELAY`] (a timer,
/// never the executor), and says whether it must now close (its last allowed failure).
pub(crate) async fn after_failure(
    counters: &RefCell<super::counters::ConnCounters>,
    failures: &mut u32,
) -> bool {
    *failures += 1;
    glommio::timer::sleep(AUTH_FAILURE_DELAY).await;
    let close = *failures >= AUTH_FAILURES_MAX;
    if close {
        counters.borrow_mut().auth_closed += 1;
    }
    close
}

/// Users and their passwords.
#[derive(Debug, Clone)]
pub struct Credentials {
    users: HashMap<Vec<u8>, Vec<u8>>,
}

/// How a SASL exchange ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthOutcome {
    Authenticated {
        user: String,
    },
    /// A mechanism other than PLAIN.
    UnknownMechanism,
    /// Malformed PLAIN data, an unknown user or a wrong password (said alike to the client).
    Refused {
        user: String,
    },
}

impl Credentials {
    /// Reads a password file: one `user:password` per line; blank lines and `#` comments are
    /// skipped; a line without `:` or with an empty user is an error naming its number.
    pub fn read(path: &Path) -> Result<Credentials, String> {
        let fail = |why: String| format!("--sasl-password-file {}: {why}", path.display());
        let text = std::fs::read(path).map_err(|err| fail(err.to_string()))?;
        Credentials::parse(&text).map_err(fail)
    }

    pub fn parse(text: &[u8]) -> Result<Credentials, String> {
        let mut users = HashMap::new();
        for (number, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.trim_ascii().is_empty() || line.starts_with(b"#") {
                continue;
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                return Err(format!("line {} is not user:password", number + 1));
            };
            let (user, password) = (&line[..colon], &line[colon + 1..]);
            if user.is_empty() {
                return Err(format!("line {} has an empty user name", number + 1));
            }
            users.insert(user.to_vec(), password.to_vec());
        }
        if users.is_empty() {
            return Err("no user:password line".to_string());
        }
        Ok(Credentials { users })
    }

    /// Runs a SASL AUTH (or STEP) with `mechanism` and its data. PLAIN's data is
    /// `authzid NUL authcid NUL password`; the authorization identity, if any, must be the
    /// user itself.
    pub fn authenticate(&self, mechanism: &[u8], data: &[u8]) -> AuthOutcome {
        if mechanism != MECHANISMS.as_bytes() {
            return AuthOutcome::UnknownMechanism;
        }
        let mut parts = data.splitn(3, |&b| b == 0);
        let (Some(authzid), Some(user), Some(password)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return AuthOutcome::Refused {
                user: String::new(),
            };
        };
        let name = String::from_utf8_lossy(user).into_owned();
        let known = self.users.get(user);
        // Compare against something of the same shape for unknown users too.
        let expected: &[u8] = known.map_or(b"", Vec::as_slice);
        let matches = constant_time_eq(expected, password) && known.is_some();
        if matches && (authzid.is_empty() || authzid == user) {
            AuthOutcome::Authenticated { user: name }
        } else {
            AuthOutcome::Refused { user: name }
        }
    }
}

/// Equality whose time does not depend on where the inputs first differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_file_and_plain() {
        let creds = Credentials::parse(b"# users\nalice:s3cret\r\n\nbob:pa:ss\n").unwrap();
        let auth = |data: &[u8]| creds.authenticate(b"PLAIN", data);
        assert_eq!(
            auth(b"\0alice\0s3cret"),
            AuthOutcome::Authenticated {
                user: "alice".into()
            }
        );
        assert_eq!(
            auth(b"bob\0bob\0pa:ss"),
            AuthOutcome::Authenticated { user: "bob".into() },
            "a password may hold ':'"
        );
        assert_eq!(
            auth(b"\0alice\0s3cre"),
            AuthOutcome::Refused {
                user: "alice".into()
            }
        );
        assert_eq!(
            auth(b"bob\0alice\0s3cret"),
            AuthOutcome::Refused {
                user: "alice".into()
            },
            "another authorization identity"
        );
        assert_eq!(
            auth(b"\0carol\0"),
            AuthOutcome::Refused {
                user: "carol".into()
            }
        );
        assert_eq!(auth(b"alice"), AuthOutcome::Refused { user: "".into() });
        assert_eq!(
            creds.authenticate(b"CRAM-MD5", b"x"),
            AuthOutcome::UnknownMechanism
        );
        assert!(Credentials::parse(b"nocolon\n").is_err());
        assert!(Credentials::parse(b":empty\n").is_err());
        assert!(Credentials::parse(b"\n# only comments\n").is_err());
    }
}
