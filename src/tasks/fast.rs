//! The task fast path: `start_task` and `cancel_task` without a python3 start.
//! A bash client ([`CLIENT`]: builtins only) hands the
//! supervisor's argv to the sandbox's long-lived fork server (the
//! supervisor's `serve`, forked from the first `start` after it answered) and
//! prints the server's answer as the supervisor would. When no server of this
//! supervisor version is alive, or anything fails before the request is sent,
//! the client runs the same argv with python3 itself, which (for `start`)
//! forks a new server for the next call. The protocol is described beside
//! `serve` in `supervisor/supervisor.py`.

/// Environment variable carrying the task spec (base64 JSON) to the client and
/// the supervisor: a process's environment is readable only by its own user,
/// unlike its argv. The supervisor removes it before anything is forked.
pub const SPEC_ENV: &str = "SANDBOX_MCP_TASK_SPEC";

/// The program that runs the client (every task already needs it: tasks run
/// as `/bin/bash -c COMMAND`).
pub const SHELL: &str = "/bin/bash";

/// Seconds the client waits for the server's answer once the request is sent.
pub const NO_ANSWER_SECONDS: u32 = 10;

/// The client, as `bash -c CLIENT sandbox-mcp-task BASE VERSION PYTHON_ARGV...`
/// where `PYTHON_ARGV` is the supervisor's own invocation (`python3 -I -S -c
/// PROGRAM SUBCOMMAND OPTIONS...`, five words before the subcommand).
///
/// - The server is used only if `server-V.pid` names a live process (not a
///   zombie) with the recorded start time (`/proc/PID/stat` fields 3 and 22),
///   and the client could make its reply pipe and its answer file
///   `queue/PID.out` (its pid is unique among live clients).
/// - The reply pipe costs no process: a here-string is a pipe in bash ≥ 5.1,
///   which the client reopens read-write through `/proc/$$/fd` (so it never
///   reads end-of-file) and the server opens for writing as
///   `/proc/PID/fd/FD`. An older bash (a here-string in a temporary file)
///   takes the python3 path.
/// - The request is one line on the server's FIFO, atomic under `PIPE_BUF`:
///   the client's pid, start time and reply descriptor (the server checks
///   the first two before it answers), the subcommand's words, and `-- SPEC`
///   for a start; a longer request goes to `queue/PID.req` (a line per word)
///   and the line says `@`.
/// - The server writes the JSON into `PID.out` (a regular file, which bash
///   reads in one go; held open by the client), then the exit code into the
///   reply pipe; the client prints the one and exits with the other.
/// - Every open is a compound command's redirection, so a failure never kills
///   the shell: anything failing before the request's line is written falls
///   back to python3 (nothing was sent); a request sent and not answered
///   within [`NO_ANSWER_SECONDS`], or whose server ended without answering
///   (checked every quarter of a second), is reported with code `uncertain`
///   (it may have been carried out).
pub const CLIENT: &str = r#"d=$1 v=$2; shift 2
s="$d/server-$v" q="$d/queue/$$" sent= r= rc= gone=
alive() { read -r -a st 2>/dev/null <"/proc/$pid/stat" && [ "${st[21]}" = "$start" ] && [[ ${st[2]} != [ZXx] ]]; }
if read -r pid start 2>/dev/null <"$s.pid" && alive && read -r -a me 2>/dev/null </proc/$$/stat &&
  { exec {h}<<<''; } 2>/dev/null && [[ -p /proc/$$/fd/$h ]] &&
  { exec {r}<>"/proc/$$/fd/$h" {h}<&-; } 2>/dev/null && read -r -u "$r" && : 2>/dev/null >"$q.out"; then
  line="$$ ${me[21]} $r ${*:6}${SANDBOX_MCP_TASK_SPEC+ -- $SANDBOX_MCP_TASK_SPEC}"
  if [ ${#line} -gt 4000 ]; then
    { printf '%s\n' "${@:6}"; [ -z "${SANDBOX_MCP_TASK_SPEC+x}" ] || printf -- '--\n%s\n' "$SANDBOX_MCP_TASK_SPEC"; } 2>/dev/null >"$q.req" &&
      line="$$ ${me[21]} $r @" || line=
  fi
  {
    [ -n "$line" ] && printf '%s\n' "$line" >&3 && sent=1
    exec 3>&-
    for ((w = 0; sent && w < 40; w++)); do
      IFS= read -r -t 0.25 -u "$r" rc && break
      rc=
      alive || { IFS= read -r -t 0.05 -u "$r" rc || gone=1; break; }
    done
    if [ -n "$rc" ]; then
      IFS= read -r -d '' out <&5
      printf '%s' "$out"
      exit "$rc"
    fi
  } 2>/dev/null 3<>"$s.fifo" 5<"$q.out"
  if [ -n "$gone" ]; then
    printf '%s\n' '{"error": "the task server ended before it answered; the request may or may not have been carried out", "code": "uncertain"}'
    exit 2
  elif [ -n "$sent" ]; then
    printf '%s\n' '{"error": "the task server did not answer within 10 s; the request may or may not have been carried out", "code": "uncertain"}'
    exit 2
  fi
fi
[ -z "$r" ] || exec {r}<&-
exec "$@""#;

/// The client's argv for one supervisor invocation (`python_argv`, as
/// [`super::service::TaskService::argv`] builds it).
pub fn client_argv(base_dir: &str, version: &str, python_argv: Vec<String>) -> Vec<String> {
    let mut argv = vec![
        SHELL.to_owned(),
        "-c".to_owned(),
        CLIENT.to_owned(),
        "sandbox-mcp-task".to_owned(),
        base_dir.to_owned(),
        version.to_owned(),
    ];
    argv.extend(python_argv);
    argv
}

/// Whether a failed exec says the client's shell does not exist (then the
/// caller runs python3 directly: nothing was started).
pub fn shell_missing(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("bash") && (message.contains("no such file") || message.contains("not found"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_shell_is_recognised_in_both_envds_words() {
        assert!(shell_missing(
            "process.Start: invalid_argument: failed to start '/bin/bash': No such file or directory"
        ));
        assert!(shell_missing("fork/exec /bin/bash: no such file or directory"));
        assert!(!shell_missing("failed to start 'python3': No such file or directory"));
        assert!(!shell_missing("bash: connection reset"));
    }

    #[test]
    fn the_client_waits_as_long_as_documented_and_falls_back_to_its_argv() {
        // Quarter-second reads, as many as make NO_ANSWER_SECONDS.
        assert!(CLIENT.contains(&format!("sent && w < {}; w++", NO_ANSWER_SECONDS * 4)));
        assert!(CLIENT.contains("IFS= read -r -t 0.25 -u \"$r\" rc && break"));
        assert!(CLIENT.ends_with("exec \"$@\""));
        let argv = client_argv("/b", "8", vec!["python3".into(), "-I".into()]);
        assert_eq!(argv[..2], [SHELL, "-c"]);
        assert_eq!(argv[3..], ["sandbox-mcp-task", "/b", "8", "python3", "-I"]);
    }
}
