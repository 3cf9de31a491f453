//! Supervisor task ids: 32 lowercase hex characters (128 bits) from the operating
//! system's CSPRNG, chosen by the gateway before it contacts the sandbox.

use std::fmt;

use rand::{Rng, TryRng};

/// Length of a task id in characters.
pub const TASK_ID_LEN: usize = 32;

/// A validated task id (`^[0-9a-f]{32}$`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskId(String);

/// Why a string is not a task id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "task_id must be exactly 32 lowercase hexadecimal characters (0-9, a-f) as returned by start_task or list_tasks"
)]
pub struct InvalidTaskId;

impl TaskId {
    /// A fresh random id from the OS CSPRNG (falls back to the thread-local
    /// CSPRNG, itself seeded from the OS, if the OS source fails).
    pub fn generate() -> Self {
        let mut raw = [0u8; TASK_ID_LEN / 2];
        if rand::rngs::SysRng.try_fill_bytes(&mut raw).is_err() {
            rand::rng().fill_bytes(&mut raw);
        }
        Self(hex::encode(raw))
    }

    /// Parses a task id given by a caller: exactly 32 characters of `0-9a-f`
    /// (upper case is refused, so one task never has two spellings).
    pub fn parse(raw: &str) -> Result<Self, InvalidTaskId> {
        let ok = raw.len() == TASK_ID_LEN && raw.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok { Ok(Self(raw.to_owned())) } else { Err(InvalidTaskId) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_valid_and_distinct() {
        let a = TaskId::generate();
        let b = TaskId::generate();
        assert_ne!(a, b);
        assert_eq!(TaskId::parse(a.as_str()).unwrap(), a);
        assert_eq!(a.as_str().len(), 32);
    }

    #[test]
    fn malformed_ids_are_refused() {
        for bad in [
            "",
            "0123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef0",
            "0123456789ABCDEF0123456789abcdef",
            "0123456789abcdeg0123456789abcdef",
            "../../../../etc/passwd0123456789a",
            "0123456789abcdef0123456789abcd\u{e9}",
        ] {
            assert_eq!(TaskId::parse(bad), Err(InvalidTaskId), "{bad:?}");
        }
        assert!(TaskId::parse("0123456789abcdef0123456789abcdef").is_ok());
    }
}
