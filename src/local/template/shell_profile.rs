//! The base template's `/etc/profile`: the host's, with its start-up cost
//! taken out. Debian's (and most distributions') profile asks `$(id -u)`
//! which user it runs for: a fork and an exec of `id` (with its libraries)
//! in every login shell, about 2-4 ms of each `run_command` (`bash -l -c`)
//! in a sandbox. bash knows the answer already (`EUID`), so the question is
//! asked as `${EUID:-$(id -u)}`: the same answer, no process under bash, and
//! `id` still asked by shells without `EUID` (dash, busybox sh). Nothing
//! else of the profile changes (PATH, the `profile.d` scripts, PS1).

/// The expensive form and its replacement.
const ASK_ID: &str = "$(id -u)";
const ASK_EUID: &str = "${EUID:-$(id -u)}";

/// `profile` with every `$(id -u)` answered by bash's `EUID` when it has one.
pub fn lighten(profile: &str) -> String {
    // Already rewritten text holds ASK_ID inside ASK_EUID: undo first, so the result is the same.
    profile.replace(ASK_EUID, ASK_ID).replace(ASK_ID, ASK_EUID)
}

/// Rewrites `path` in place (a template being built) when it is a regular file. Anything else (a
/// symlink, which could lead out of the template, a directory, a missing file, text that is not
/// UTF-8) is left as it is.
pub fn lighten_file(path: &std::path::Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => {}
        Ok(_) => return Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    }
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::InvalidData => return Ok(()),
        Err(err) => return Err(err),
    };
    let lighter = lighten(&text);
    if lighter != text {
        std::fs::write(path, lighter)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEBIAN: &str = "if [ \"$(id -u)\" -eq 0 ]; then\n  PATH=\"/usr/local/sbin:/usr/sbin\"\nelse\n  \
                          PATH=\"/usr/bin\"\nfi\nexport PATH\nif [ \"$(id -u)\" -eq 0 ]; then PS1='# '; fi\n";

    #[test]
    fn id_is_asked_only_without_euid_and_rewriting_is_idempotent() {
        let once = lighten(DEBIAN);
        assert!(!once.replace(ASK_EUID, "").contains(ASK_ID), "{once}");
        assert_eq!(once.matches(ASK_EUID).count(), 2);
        assert_eq!(lighten(&once), once);
        assert_eq!(lighten("PATH=/bin\n"), "PATH=/bin\n");
    }

    #[test]
    fn only_regular_files_are_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let (target, link) = (dir.path().join("target"), dir.path().join("link"));
        std::fs::write(&target, DEBIAN).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        lighten_file(&link).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), DEBIAN, "a symlink is not followed");
        lighten_file(&dir.path().join("missing")).unwrap();
        lighten_file(dir.path()).unwrap();
        lighten_file(&target).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), lighten(DEBIAN));
    }

    /// The rewritten profile gives bash (as root and as a user) and sh the same PATH as the host's.
    #[test]
    fn rewritten_profile_gives_the_same_path() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        std::fs::write(&old, DEBIAN).unwrap();
        std::fs::write(&new, lighten(DEBIAN)).unwrap();
        for shell in ["bash", "sh"] {
            let path = |file: &std::path::Path| {
                let out = std::process::Command::new(shell)
                    .arg("-c")
                    .arg(format!(". {}; printf %s \"$PATH\"", file.display()))
                    .output()
                    .unwrap();
                String::from_utf8(out.stdout).unwrap()
            };
            assert_eq!(path(&old), path(&new), "{shell}");
            assert!(!path(&new).is_empty());
        }
    }
}
