//! Sandbox user accounts: who a request runs as (HTTP Basic user, `username=`
//! query, or the default user), resolved through /etc/passwd and /etc/group
//! and kept while those files are unchanged (`account_cache`).

use std::ffi::CString;
use std::sync::LazyLock;

use base64::Engine;
use http::HeaderMap;

use super::account_cache::AccountCache;
use crate::connect_rpc::{Code, ConnectError};

/// The files the C library's user and group lookups read in a sandbox.
fn account_files() -> [std::path::PathBuf; 3] {
    ["/etc/passwd", "/etc/group", "/etc/nsswitch.conf"].map(std::path::PathBuf::from)
}

type Accounts<K, V> = LazyLock<AccountCache<K, V, 3>>;

/// Accounts by name.
static ACCOUNTS: Accounts<String, UserAccount> = LazyLock::new(|| AccountCache::new(account_files()));
/// User names by uid and group names by gid, for the owners of listed files.
static USER_NAMES: Accounts<u32, String> = LazyLock::new(|| AccountCache::new(account_files()));
static GROUP_NAMES: Accounts<u32, String> = LazyLock::new(|| AccountCache::new(account_files()));

/// A resolved account: everything needed to run a process or a file operation as it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserAccount {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: std::path::PathBuf,
    /// Supplementary groups (including the primary group).
    pub groups: Vec<u32>,
}

/// Looks up `name` in the user database.
pub fn resolve_user(name: &str) -> Result<UserAccount, ConnectError> {
    if name.is_empty() || name.contains('\0') {
        return Err(unknown_user(name));
    }
    ACCOUNTS.get(name, look_up_user)
}

fn unknown_user(name: &str) -> ConnectError {
    ConnectError::new(Code::Unauthenticated, format!("invalid user: '{name}' does not exist in the sandbox"))
}

/// `name`'s account, from the C library's user database.
fn look_up_user(name: &str) -> Result<UserAccount, ConnectError> {
    let unknown = || unknown_user(name);
    let user = match nix::unistd::User::from_name(name) {
        Ok(Some(user)) => user,
        Ok(None) => return Err(unknown()),
        Err(err) => return Err(ConnectError::new(Code::Internal, format!("looking up user '{name}': {err}"))),
    };
    let mut groups = CString::new(name)
        .ok()
        .and_then(|cname| nix::unistd::getgrouplist(&cname, user.gid).ok())
        .map(|gids| gids.into_iter().map(|g| g.as_raw()).collect::<Vec<_>>())
        .unwrap_or_default();
    if !groups.contains(&user.gid.as_raw()) {
        groups.push(user.gid.as_raw());
    }
    Ok(UserAccount { name: user.name, uid: user.uid.as_raw(), gid: user.gid.as_raw(), home: user.dir, groups })
}

/// The user named by `Authorization: Basic base64("<user>:")`, if any.
pub fn basic_auth_user(headers: &HeaderMap) -> Result<Option<String>, ConnectError> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = |why: &str| ConnectError::new(Code::Unauthenticated, format!("invalid Authorization header: {why}"));
    let text = value.to_str().map_err(|_| bad("not ASCII"))?;
    let Some((scheme, encoded)) = text.trim().split_once(' ') else {
        return Err(bad("expected 'Basic <base64(user:)>'"));
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        // Bearer tokens of old SDKs are accepted and ignored.
        return Ok(None);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| bad("credentials are not base64"))?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad("credentials are not UTF-8"))?;
    let user = decoded.split_once(':').map(|(u, _)| u).unwrap_or(&decoded);
    if user.is_empty() { Ok(None) } else { Ok(Some(user.to_owned())) }
}

/// Resolves the user of an RPC: Basic auth, else `default_user`.
pub fn request_user(headers: &HeaderMap, default_user: &str) -> Result<UserAccount, ConnectError> {
    match basic_auth_user(headers)? {
        Some(name) => resolve_user(&name),
        None => resolve_user(default_user),
    }
}

/// Looks up the name of a uid, falling back to the number.
pub fn user_name(uid: u32) -> String {
    let named = USER_NAMES.get(&uid, |&uid| match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => Ok(user.name),
        _ => Err(()),
    });
    named.unwrap_or_else(|()| uid.to_string())
}

/// Looks up the name of a gid, falling back to the number.
pub fn group_name(gid: u32) -> String {
    let named = GROUP_NAMES.get(&gid, |&gid| match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
        Ok(Some(group)) => Ok(group.name),
        _ => Err(()),
    });
    named.unwrap_or_else(|()| gid.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_basic_auth_with_empty_password() {
        let mut headers = HeaderMap::new();
        assert_eq!(basic_auth_user(&headers).unwrap(), None);
        headers.insert(http::header::AUTHORIZATION, "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(basic_auth_user(&headers).unwrap().as_deref(), Some("root"));
        headers.insert(http::header::AUTHORIZATION, "Basic !!!".parse().unwrap());
        assert_eq!(basic_auth_user(&headers).unwrap_err().code, Code::Unauthenticated);
    }

    #[test]
    fn resolves_root_and_rejects_unknown() {
        let root = resolve_user("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        let err = resolve_user("no-such-user-xyz").unwrap_err();
        assert_eq!(err.code, Code::Unauthenticated);
        assert!(err.message.contains("no-such-user-xyz"));
    }
}
