//! The gateway's line channel to each sandbox's starts: one long-lived supervisor process per
//! sandbox (`channel`, described in `supervisor/supervisor.py`), started through envd's process
//! API with its stdin open and its output stream kept. A start is one request line sent with
//! `SendInput` and one answer line read from that stream: no process is started per call, not
//! even the fork server's bash client ([`super::fast`]).
//!
//! [`Channels`] owns the channels of one gateway: it opens at most one per sandbox (beside a
//! start that takes the bash path, never in its way), routes answers to their callers by request
//! id, forgets a channel whose process ended, whose stream broke or that misbehaved (the transport
//! then ends a process that may live on), and gives them all up at shutdown. Every
//! failure before a request's line was sent lets the caller take the bash path; after it, the
//! outcome is uncertain, as with the bash client.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::transport::{ChannelIo, ExecOutput, SendInput, TransportError};

/// Most channels one gateway keeps open (each holds one provider connection).
pub const MAX_CHANNELS: usize = 256;
/// How long a new channel may take to greet (a python3 start, the first in a busy sandbox).
const HELLO_WITHIN: Duration = Duration::from_secs(30);
/// How long after a failed channel the next one is tried in the same sandbox.
const RETRY_AFTER: Duration = Duration::from_secs(60);
/// Longest line a channel may write (an answer is one start's status, about 1 KiB).
const MAX_LINE: usize = 1 << 20;

/// Number of starts answered through a channel since the gateway started (`/metrics`).
pub static CHANNEL_STARTS: AtomicU64 = AtomicU64::new(0);

enum Slot {
    /// Opened (or being opened), not greeted yet.
    Opening(u64),
    Ready(Arc<Channel>),
    /// Failed recently: not tried again before this instant.
    Failed(Instant),
}

type Slots = Arc<Mutex<HashMap<String, Slot>>>;

/// One live channel process.
pub struct Channel {
    generation: u64,
    /// The process's pid, from its greeting (0 before).
    pid: std::sync::atomic::AtomicU32,
    send: SendInput,
    /// One `SendInput` at a time, so a line is never interleaved with another's.
    write_lock: tokio::sync::Mutex<()>,
    pending: Mutex<HashMap<u64, oneshot::Sender<ExecOutput>>>,
    next_id: AtomicU64,
    /// Set once its output has ended: no request is sent any more.
    closed: std::sync::atomic::AtomicBool,
}

/// The channels of one gateway, by sandbox id.
#[derive(Default)]
pub struct Channels {
    slots: Slots,
    generations: AtomicU64,
    /// Cancelled at shutdown: every channel is given up (its transport ends its process).
    stop: CancellationToken,
    /// The channels' reading tasks (each awaits its transport's forwarder).
    readers: TaskTracker,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channels").field("open", &crate::sync::lock(&self.slots).len()).finish()
    }
}

impl Channels {
    /// The sandbox's greeted channel, if it has one.
    pub fn ready(&self, sandbox_id: &str) -> Option<Arc<Channel>> {
        match crate::sync::lock(&self.slots).get(sandbox_id) {
            Some(Slot::Ready(channel)) => Some(Arc::clone(channel)),
            _ => None,
        }
    }

    /// Claims the opening of the sandbox's channel: a generation number when the caller should
    /// open one now (none open or opening, none failed recently, fewer than [`MAX_CHANNELS`]).
    pub fn claim_open(&self, sandbox_id: &str) -> Option<u64> {
        let mut slots = crate::sync::lock(&self.slots);
        match slots.get(sandbox_id) {
            Some(Slot::Opening(_) | Slot::Ready(_)) => return None,
            Some(Slot::Failed(until)) if Instant::now() < *until => return None,
            _ => {}
        }
        if slots.len() >= MAX_CHANNELS {
            let now = Instant::now();
            slots.retain(|_, s| !matches!(s, Slot::Failed(until) if now >= *until));
            if slots.values().filter(|s| !matches!(s, Slot::Failed(_))).count() >= MAX_CHANNELS {
                return None;
            }
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        slots.insert(sandbox_id.to_owned(), Slot::Opening(generation));
        Some(generation)
    }

    /// The opening claimed as `generation` failed: none is tried for a while.
    pub fn open_failed(&self, sandbox_id: &str, generation: u64, why: &str) {
        tracing::debug!(sandbox_id, error = why, "no task channel; starts take the bash client's path");
        forget(&self.slots, sandbox_id, generation, true);
    }

    /// Takes over the channel opened as `generation`: its answers are read by a task of their
    /// own; it is used once it greets with `version`.
    pub fn attach(&self, sandbox_id: &str, generation: u64, io: ChannelIo, version: &str) {
        let channel = Arc::new(Channel {
            generation,
            pid: std::sync::atomic::AtomicU32::new(0),
            send: io.send,
            write_lock: tokio::sync::Mutex::new(()),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: std::sync::atomic::AtomicBool::new(false),
        });
        let slots = Arc::clone(&self.slots);
        let sandbox_id = sandbox_id.to_owned();
        let version = version.to_owned();
        let stop = self.stop.clone();
        self.readers.spawn(async move {
            // At shutdown the output is dropped unread: the channel is given up.
            let failed = tokio::select! {
                failed = read_answers(&slots, &sandbox_id, &channel, io.output, &version) => failed,
                () = stop.cancelled() => false,
            };
            forget(&slots, &sandbox_id, generation, failed);
            // Callers still waiting learn that no answer will come (uncertain); later ones send
            // nothing.
            {
                let mut pending = crate::sync::lock(&channel.pending);
                channel.closed.store(true, Ordering::SeqCst);
                pending.clear();
            }
            if let Some(forwarder) = io.forwarder {
                let _ = forwarder.await;
            }
        });
    }

    /// Gives every channel up (their transports end their processes, so none waits for its idle
    /// exit in a sandbox that outlives this gateway) and waits for that, up to `within`.
    pub async fn close_all(&self, within: Duration) {
        self.stop.cancel();
        self.readers.close();
        if tokio::time::timeout(within, self.readers.wait()).await.is_err() {
            tracing::debug!("task channels still closing at shutdown");
        }
    }

    /// Forgets a channel that could not take a request (the next start opens another).
    pub fn drop_channel(&self, sandbox_id: &str, channel: &Channel) {
        forget(&self.slots, sandbox_id, channel.generation, true);
    }
}

/// Removes the sandbox's slot if it is still `generation`'s (`failed`: not retried for a while).
fn forget(slots: &Slots, sandbox_id: &str, generation: u64, failed: bool) {
    let mut slots = crate::sync::lock(slots);
    let ours = match slots.get(sandbox_id) {
        Some(Slot::Opening(g)) => *g == generation,
        Some(Slot::Ready(channel)) => channel.generation == generation,
        _ => false,
    };
    if ours {
        if failed {
            slots.insert(sandbox_id.to_owned(), Slot::Failed(Instant::now() + RETRY_AFTER));
        } else {
            slots.remove(sandbox_id);
        }
    }
}

/// Reads a channel's output until it ends: the greeting (within [`HELLO_WITHIN`], naming
/// `version`) makes it ready; each later line answers a request. True when the channel failed
/// (no greeting, a wrong version or a malformed line), false when its process just ended.
async fn read_answers(
    slots: &Slots,
    sandbox_id: &str,
    channel: &Arc<Channel>,
    mut output: mpsc::Receiver<Vec<u8>>,
    version: &str,
) -> bool {
    let mut buffer: Vec<u8> = Vec::new();
    let mut greeted = false;
    let hello_deadline = tokio::time::Instant::now() + HELLO_WITHIN;
    loop {
        let chunk = if greeted {
            output.recv().await
        } else {
            match tokio::time::timeout_at(hello_deadline, output.recv()).await {
                Ok(chunk) => chunk,
                Err(_) => return true,
            }
        };
        let Some(chunk) = chunk else { return !greeted };
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let Some(answer) = parse_answer(&line[..end]) else { return true };
            if !greeted {
                let Some(pid) = greeting_pid(&answer, version) else { return true };
                channel.pid.store(pid, Ordering::Relaxed);
                greeted = true;
                let mut slots = crate::sync::lock(slots);
                if matches!(slots.get(sandbox_id), Some(Slot::Opening(g)) if *g == channel.generation) {
                    slots.insert(sandbox_id.to_owned(), Slot::Ready(Arc::clone(channel)));
                }
                continue;
            }
            let waiter = crate::sync::lock(&channel.pending).remove(&answer.id);
            if let Some(waiter) = waiter {
                let _ = waiter.send(ExecOutput { exit_code: answer.code, stdout: answer.stdout, stderr: Vec::new() });
            }
        }
        if buffer.len() > MAX_LINE {
            return true;
        }
    }
}

struct Answer {
    id: u64,
    code: i32,
    stdout: Vec<u8>,
}

/// `ID RC JSON` (the JSON given back with its newline, as the supervisor prints it).
fn parse_answer(line: &[u8]) -> Option<Answer> {
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.splitn(3, ' ');
    let id = parts.next()?.parse().ok()?;
    let code = parts.next()?.parse().ok()?;
    let mut stdout = parts.next()?.as_bytes().to_vec();
    stdout.push(b'\n');
    Some(Answer { id, code, stdout })
}

/// The channel's pid, if `answer` is its greeting (id 0) naming `version`.
fn greeting_pid(answer: &Answer, version: &str) -> Option<u32> {
    let greeting: serde_json::Value = serde_json::from_slice(&answer.stdout).ok()?;
    let pid = greeting.get("pid")?.as_u64().and_then(|p| u32::try_from(p).ok())?;
    (answer.id == 0 && greeting.get("version")?.as_str()? == version).then_some(pid)
}

impl Channel {
    /// The channel process's pid (in its sandbox).
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// Sends `words` (a request without its id) and waits up to `wait` for the answer.
    /// [`TransportError::NotSent`] when the line certainly did not reach the process.
    pub async fn call(&self, words: &str, wait: Duration) -> Result<ExecOutput, TransportError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = crate::sync::lock(&self.pending);
            if self.closed.load(Ordering::SeqCst) {
                return Err(TransportError::NotSent("the task channel has ended".to_owned()));
            }
            pending.insert(id, tx);
        }
        let sent = {
            let _one_at_a_time = self.write_lock.lock().await;
            (self.send)(format!("{id} {words}\n").into_bytes()).await
        };
        if let Err(err) = sent {
            crate::sync::lock(&self.pending).remove(&id);
            return Err(err);
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(out)) => {
                CHANNEL_STARTS.fetch_add(1, Ordering::Relaxed);
                Ok(out)
            }
            Ok(Err(_)) => Err(TransportError::Uncertain(
                "the task channel ended before it answered; the request may or may not have been carried out"
                    .to_owned(),
            )),
            Err(_) => {
                crate::sync::lock(&self.pending).remove(&id);
                Err(TransportError::Uncertain(format!(
                    "the task channel did not answer within {} s; the request may or may not have been carried out",
                    wait.as_secs()
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_parsed_with_their_json_and_garbage_is_refused() {
        let answer = parse_answer(br#"12 2 {"error":"x","code":"exists"}"#).unwrap();
        assert_eq!((answer.id, answer.code), (12, 2));
        assert_eq!(answer.stdout, b"{\"error\":\"x\",\"code\":\"exists\"}\n");
        assert!(parse_answer(b"hello").is_none());
        assert!(parse_answer(b"1 x {}").is_none());
        assert!(parse_answer(b"-1 0 {}").is_none());
        let greeting = |line: &[u8]| greeting_pid(&parse_answer(line).unwrap(), "9");
        assert_eq!(greeting(br#"0 0 {"version":"9","pid":4}"#), Some(4));
        assert_eq!(greeting(br#"0 0 {"version":"8","pid":4}"#), None);
        assert_eq!(greeting(br#"1 0 {"version":"9","pid":4}"#), None);
        assert_eq!(greeting(b"0 0 not json"), None);
    }

    fn io_pair() -> (ChannelIo, mpsc::Sender<Vec<u8>>, mpsc::UnboundedReceiver<Vec<u8>>) {
        let (out_tx, out_rx) = mpsc::channel(8);
        let (in_tx, in_rx) = mpsc::unbounded_channel();
        let send: SendInput = Box::new(move |data| {
            let in_tx = in_tx.clone();
            Box::pin(async move { in_tx.send(data).map_err(|_| TransportError::NotSent("closed".into())) })
        });
        (ChannelIo { send, output: out_rx, forwarder: None }, out_tx, in_rx)
    }

    /// Opens a channel for `sandbox` and has it greet with `version`; its output and input ends.
    async fn opened(
        channels: &Channels,
        sandbox: &str,
        version: &str,
    ) -> (mpsc::Sender<Vec<u8>>, mpsc::UnboundedReceiver<Vec<u8>>) {
        let generation = channels.claim_open(sandbox).unwrap();
        let (io, out, input) = io_pair();
        channels.attach(sandbox, generation, io, "9");
        out.send(format!("0 0 {{\"version\":\"{version}\",\"pid\":7}}\n").into_bytes()).await.unwrap();
        (out, input)
    }

    async fn ready_within(channels: &Channels, sandbox: &str) -> Option<Arc<Channel>> {
        for _ in 0..200 {
            if let Some(channel) = channels.ready(sandbox) {
                return Some(channel);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }

    #[tokio::test]
    async fn a_channel_is_used_once_greeted_and_answers_reach_their_callers() {
        let channels = Channels::default();
        let generation = channels.claim_open("sb").unwrap();
        assert_eq!(channels.claim_open("sb"), None, "one opening per sandbox");
        let (io, out, mut input) = io_pair();
        channels.attach("sb", generation, io, "9");
        assert!(channels.ready("sb").is_none(), "not before its greeting");
        out.send(b"0 0 {\"version\":\"9\",\"pid\":7}\n".to_vec()).await.unwrap();
        let channel = ready_within(&channels, "sb").await.expect("greeted");
        let call = tokio::spawn({
            let channel = Arc::clone(&channel);
            async move { channel.call("start --task-id x -- c3BlYw==", Duration::from_secs(5)).await }
        });
        let line = input.recv().await.unwrap();
        assert_eq!(line, b"1 start --task-id x -- c3BlYw==\n");
        // An answer split across chunks, after one for nobody.
        out.send(b"77 0 {}\n1 0 {\"task_i".to_vec()).await.unwrap();
        out.send(b"d\":\"x\"}\n".to_vec()).await.unwrap();
        let answer = call.await.unwrap().unwrap();
        assert_eq!((answer.exit_code, answer.stdout), (0, b"{\"task_id\":\"x\"}\n".to_vec()));
        // The process ends: a waiting caller is told the outcome is uncertain, and the
        // sandbox may open a new channel at once.
        let waiting = tokio::spawn({
            let channel = Arc::clone(&channel);
            async move { channel.call("start", Duration::from_secs(5)).await }
        });
        input.recv().await.unwrap();
        drop(out);
        assert!(matches!(waiting.await.unwrap(), Err(TransportError::Uncertain(_))));
        let after = channel.call("start", Duration::from_secs(5)).await;
        assert!(matches!(after, Err(TransportError::NotSent(_))), "nothing is sent to an ended channel");
        assert!(channels.ready("sb").is_none());
        assert!(channels.claim_open("sb").is_some());
    }

    #[tokio::test]
    async fn a_wrong_greeting_or_a_garbled_line_fails_the_channel_for_a_while() {
        let channels = Channels::default();
        let _wrong = opened(&channels, "sb", "8").await;
        for _ in 0..200 {
            if matches!(crate::sync::lock(&channels.slots).get("sb"), Some(Slot::Failed(_))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(matches!(crate::sync::lock(&channels.slots).get("sb"), Some(Slot::Failed(_))));
        assert_eq!(channels.claim_open("sb"), None, "not retried at once");

        let (out, _input) = opened(&channels, "other", "9").await;
        ready_within(&channels, "other").await.expect("greeted");
        out.send(b"forged answer\n".to_vec()).await.unwrap();
        for _ in 0..200 {
            if channels.ready("other").is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(channels.ready("other").is_none(), "a malformed line ends the channel");
    }

    #[tokio::test]
    async fn a_request_that_cannot_be_sent_is_not_sent_and_a_silent_channel_is_uncertain() {
        let channels = Channels::default();
        let (_out, input) = opened(&channels, "sb", "9").await;
        let channel = ready_within(&channels, "sb").await.expect("greeted");
        let silent = channel.call("start", Duration::from_millis(50)).await;
        assert!(matches!(silent, Err(TransportError::Uncertain(m)) if m.contains("did not answer")));
        drop(input);
        let unsent = channel.call("start", Duration::from_secs(5)).await;
        assert!(matches!(unsent, Err(TransportError::NotSent(_))));
        assert!(crate::sync::lock(&channel.pending).is_empty());
    }
}
