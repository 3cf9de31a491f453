//! The process table: every process envd started (pid → config, tag, stdin,
//! subscribers, end event), the output pump that fans a process's stdout and
//! stderr out to its subscribers, and the record of recently exited processes
//! for late `Connect` calls.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::reaper::{ExitCell, ExitOutcome};
use super::spawn::signal_group;
use crate::e2b::wire::{EndEvent, ProcessConfig, ProcessInfo};

/// Largest raw chunk carried by one data event.
pub const OUTPUT_CHUNK: usize = 64 * 1024;
/// How many exited processes are remembered.
const EXITED_KEEP: usize = 256;
/// How long an exited process is remembered.
const EXITED_TTL: Duration = Duration::from_secs(600);
/// After the process exited, output pipes still open (held by background
/// children) stop being forwarded once idle this long...
const AFTER_EXIT_IDLE: Duration = Duration::from_millis(100);
/// ...or at the latest this long after the exit (a chatty background child
/// must not hold back the end event forever).
const AFTER_EXIT_MAX: Duration = Duration::from_secs(2);
/// Capacity of each subscriber's event queue.
const SUBSCRIBER_QUEUE: usize = 16;

/// An event delivered to the subscribers of a process.
#[derive(Debug, Clone)]
pub enum ProcOutput {
    Stdout(Bytes),
    Stderr(Bytes),
    End(EndEvent),
}

/// One running (or just-finished) process.
pub struct ProcessEntry {
    pub pid: u32,
    pub config: ProcessConfig,
    pub tag: Option<String>,
    /// Our end of its stdin; `None` when not piped or closed.
    pub stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    pub exit: Arc<ExitCell>,
    state: Mutex<EntryState>,
}

#[derive(Default)]
struct EntryState {
    subscribers: Vec<mpsc::Sender<ProcOutput>>,
    end: Option<EndEvent>,
}

/// What `Connect` finds for a pid.
pub enum Attach {
    Live(mpsc::Receiver<ProcOutput>),
    Exited(EndEvent),
}

struct ExitedRecord {
    pid: u32,
    tag: Option<String>,
    end: EndEvent,
    at: Instant,
}

#[derive(Default)]
struct TableInner {
    running: HashMap<u32, Arc<ProcessEntry>>,
    exited: VecDeque<ExitedRecord>,
}

/// The processes of one envd.
#[derive(Default)]
pub struct ProcessTable {
    inner: Mutex<TableInner>,
}

impl ProcessTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, TableInner> {
        crate::sync::lock(&self.inner)
    }

    /// Registers a new process with one initial subscriber (the Start caller).
    pub fn insert(
        &self,
        pid: u32,
        config: ProcessConfig,
        tag: Option<String>,
        stdin: Option<pipe::Sender>,
        exit: Arc<ExitCell>,
    ) -> (Arc<ProcessEntry>, mpsc::Receiver<ProcOutput>) {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
        let entry = Arc::new(ProcessEntry {
            pid,
            config,
            tag,
            stdin: tokio::sync::Mutex::new(stdin),
            exit,
            state: Mutex::new(EntryState { subscribers: vec![tx], end: None }),
        });
        let mut inner = self.lock();
        inner.exited.retain(|r| r.pid != pid);
        inner.running.insert(pid, entry.clone());
        (entry, rx)
    }

    /// Finds a running process by pid or tag.
    pub fn running(&self, pid: Option<u32>, tag: Option<&str>) -> Option<Arc<ProcessEntry>> {
        let inner = self.lock();
        match (pid, tag) {
            (Some(pid), _) => inner.running.get(&pid).cloned(),
            (None, Some(tag)) => inner.running.values().find(|e| e.tag.as_deref() == Some(tag)).cloned(),
            (None, None) => None,
        }
    }

    /// Subscribes to a process's live output, or returns its stored end event.
    pub fn attach(&self, pid: Option<u32>, tag: Option<&str>) -> Option<(u32, Attach)> {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.exited.retain(|r| now.duration_since(r.at) < EXITED_TTL);
        let live = match (pid, tag) {
            (Some(pid), _) => inner.running.get(&pid).cloned(),
            (None, Some(tag)) => inner.running.values().find(|e| e.tag.as_deref() == Some(tag)).cloned(),
            (None, None) => None,
        };
        if let Some(entry) = live {
            let mut state = crate::sync::lock(&entry.state);
            if let Some(end) = &state.end {
                return Some((entry.pid, Attach::Exited(end.clone())));
            }
            let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
            state.subscribers.push(tx);
            return Some((entry.pid, Attach::Live(rx)));
        }
        let record = inner.exited.iter().rev().find(|r| match (pid, tag) {
            (Some(pid), _) => r.pid == pid,
            (None, Some(tag)) => r.tag.as_deref() == Some(tag),
            (None, None) => false,
        })?;
        Some((record.pid, Attach::Exited(record.end.clone())))
    }

    /// Running processes, for `List`.
    pub fn list(&self) -> Vec<ProcessInfo> {
        let inner = self.lock();
        let mut out: Vec<ProcessInfo> = inner
            .running
            .values()
            .filter(|e| e.exit.status().is_none())
            .map(|e| ProcessInfo { config: e.config.clone(), pid: e.pid, tag: e.tag.clone() })
            .collect();
        out.sort_by_key(|p| p.pid);
        out
    }

    fn finish(&self, entry: &ProcessEntry, end: EndEvent) -> Vec<mpsc::Sender<ProcOutput>> {
        let mut inner = self.lock();
        let subscribers = {
            let mut state = crate::sync::lock(&entry.state);
            state.end = Some(end.clone());
            std::mem::take(&mut state.subscribers)
        };
        if inner.running.get(&entry.pid).is_some_and(|e| std::ptr::eq(e.as_ref(), entry)) {
            inner.running.remove(&entry.pid);
        }
        inner.exited.push_back(ExitedRecord { pid: entry.pid, tag: entry.tag.clone(), end, at: Instant::now() });
        while inner.exited.len() > EXITED_KEEP {
            inner.exited.pop_front();
        }
        subscribers
    }
}

impl ProcessEntry {
    async fn broadcast(&self, event: ProcOutput) {
        let subscribers = crate::sync::lock(&self.state).subscribers.clone();
        if subscribers.is_empty() {
            return;
        }
        let mut any_closed = false;
        for subscriber in &subscribers {
            // Backpressure: a connected but slow client slows the process down, like a pipe.
            if subscriber.send(event.clone()).await.is_err() {
                any_closed = true;
            }
        }
        if any_closed {
            crate::sync::lock(&self.state).subscribers.retain(|s| !s.is_closed());
        }
    }
}

/// Kills the process group of `entry` after `timeout`, unless it has exited by then.
pub fn spawn_kill_deadline(entry: &Arc<ProcessEntry>, timeout: Duration) {
    let exit = entry.exit.clone();
    let pid = entry.pid;
    tokio::spawn(async move {
        tokio::select! {
            _ = exit.wait() => {}
            _ = tokio::time::sleep(timeout) => {
                if exit.status().is_none() {
                    tracing::debug!(pid, "connect-timeout-ms expired: killing the process group");
                    let _ = signal_group(pid, libc::SIGKILL);
                }
            }
        }
    });
}

/// Reads the process's output until it exited and its pipes are drained (or idle),
/// fans it out, then publishes the end event.
pub async fn pump_output(table: Arc<ProcessTable>, entry: Arc<ProcessEntry>, stdout: OwnedFd, stderr: OwnedFd) {
    let mut stdout = pipe::Receiver::from_owned_fd(stdout).ok();
    let mut stderr = pipe::Receiver::from_owned_fd(stderr).ok();
    let mut status: Option<i32> = None;
    let mut exited_at = Instant::now();
    loop {
        if status.is_some() && stdout.is_none() && stderr.is_none() {
            break;
        }
        let drain_wait = AFTER_EXIT_IDLE.min(AFTER_EXIT_MAX.saturating_sub(exited_at.elapsed()));
        tokio::select! {
            read = read_chunk(&mut stdout), if stdout.is_some() => match read {
                Some(chunk) => entry.broadcast(ProcOutput::Stdout(chunk)).await,
                None => stdout = None,
            },
            read = read_chunk(&mut stderr), if stderr.is_some() => match read {
                Some(chunk) => entry.broadcast(ProcOutput::Stderr(chunk)).await,
                None => stderr = None,
            },
            raw = entry.exit.wait(), if status.is_none() => {
                status = Some(raw);
                exited_at = Instant::now();
            }
            _ = tokio::time::sleep(drain_wait), if status.is_some() => break,
        }
    }
    // Pipes still held open by background children: keep draining so they never block.
    for pipe in [stdout, stderr].into_iter().flatten() {
        tokio::spawn(drain(pipe));
    }
    let outcome = ExitOutcome::from_wait_status(status.unwrap_or(255 << 8));
    let end = EndEvent {
        exit_code: outcome.exit_code,
        exited: outcome.exited,
        status: outcome.status.clone(),
        error: outcome.error(),
    };
    for subscriber in table.finish(&entry, end.clone()) {
        let _ = subscriber.send(ProcOutput::End(end.clone())).await;
    }
}

thread_local! {
    /// Read buffer shared by all pumps of a thread: idle processes hold no buffer.
    static READ_SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; OUTPUT_CHUNK]);
}

/// Reads what is available (at most [`OUTPUT_CHUNK`] bytes); `None` at EOF or on error.
async fn read_chunk(pipe: &mut Option<pipe::Receiver>) -> Option<Bytes> {
    let pipe = pipe.as_mut()?;
    loop {
        pipe.readable().await.ok()?;
        let read = READ_SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            match pipe.try_read(&mut scratch) {
                Ok(0) => Err(None),
                Ok(n) => Ok(Bytes::copy_from_slice(&scratch[..n])),
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => Err(Some(())),
                Err(_) => Err(None),
            }
        });
        match read {
            Ok(chunk) => return Some(chunk),
            Err(Some(())) => continue,
            Err(None) => return None,
        }
    }
}

async fn drain(pipe: pipe::Receiver) {
    let mut pipe = Some(pipe);
    while read_chunk(&mut pipe).await.is_some() {}
}
