//! What "running a container" means in the sim: a trait the embedder provides. The default
//! runtime runs nothing (containers just run until stopped; init containers succeed);
//! `ProcessRuntime` (`process.rs`) runs containers as processes; the `berth` binary adds one
//! that runs the Berth agent in-process.

use std::{
    collections::{BTreeMap, VecDeque},
    future::Future,
    net::Ipv4Addr,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;
use tokio::sync::oneshot;

/// Everything a container gets from its pod, as a real kubelet would give it.
#[derive(Clone, Debug)]
pub struct ContainerContext {
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    /// The pod object as the kubelet saw it when starting the container.
    pub pod: Value,
    /// The container's spec.
    pub container: Value,
    pub init: bool,
    /// The pod's IP, a unique loopback address: a server may bind it.
    pub pod_ip: Ipv4Addr,
    /// A token of the pod's service account (audience: the API server).
    pub token: String,
    /// `https://127.0.0.1:<port>`, what `KUBERNETES_SERVICE_HOST`/`PORT` point at.
    pub api_server: String,
    /// The cluster CA, what `ca.crt` holds.
    pub ca_pem: String,
    /// The files of the secret, config map, downward API and projected volumes mounted into
    /// this container, by path (the service-account token, `ca.crt` and `namespace` among
    /// them, unless the pod opted out).
    pub files: BTreeMap<String, Vec<u8>>,
    /// The container's volume mounts, in its order, with where each volume's files come from.
    pub mounts: Vec<VolumeMount>,
    /// Where the container's output goes, for `kubectl logs`.
    pub log: ContainerLog,
    /// The container's environment, references resolved, with `KUBERNETES_SERVICE_HOST` and
    /// `KUBERNETES_SERVICE_PORT`, in order.
    pub env: Vec<(String, String)>,
}

/// One volume mounted into a container.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeMount {
    /// Where the container sees it (`mountPath`).
    pub path: String,
    /// The part of the volume mounted there (`subPath`), if not all of it.
    pub sub_path: Option<String>,
    pub read_only: bool,
    pub source: VolumeSource,
}

/// Where a volume's files live, as the kubelet lays them out.
#[derive(Clone, Debug, PartialEq)]
pub enum VolumeSource {
    /// A claim's directory: the same for every pod that mounts the claim, on any node (a
    /// network volume), for as long as the claim lives.
    Claim {
        uid: String,
        /// The claim's capacity in bytes (`status.capacity.storage`, else its request): where
        /// a runtime that can bound a folder makes writes fail with `ENOSPC`.
        capacity: Option<u64>,
    },
    /// A directory of the pod's own (`emptyDir`), gone with the pod.
    EmptyDir { volume: String },
    /// Files the kubelet writes: a secret, config map, downward API or projected volume, by
    /// path within the volume.
    Files {
        volume: String,
        files: BTreeMap<String, Vec<u8>>,
    },
}

/// A started container: it reports its exit code once, and stops when asked.
pub struct RunningContainer {
    /// Resolves with the exit code when the container exits by itself or after a stop.
    pub exited: oneshot::Receiver<i32>,
    /// Asks the container to stop: SIGTERM, then SIGKILL once the grace period sent is over.
    /// Dropping it stops the container without grace.
    pub stop: oneshot::Sender<Duration>,
}

/// A command to run in a running container (`kubectl exec`).
#[derive(Clone, Debug, PartialEq)]
pub struct ExecRequest {
    pub command: Vec<String>,
    /// A terminal: output comes on stdout only, and the terminal can be resized.
    pub tty: bool,
    pub stdin: bool,
    /// The terminal's size (columns, rows) from its start: None is 80x24 until resized.
    pub size: Option<(u16, u16)>,
}

/// An output or input stream of a process.
pub type Reader = Pin<Box<dyn tokio::io::AsyncRead + Send>>;
pub type Writer = Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// A command started in a container: its streams, its terminal and its exit.
pub struct ExecSession {
    pub stdin: Option<Writer>,
    pub stdout: Option<Reader>,
    /// None with a terminal: its output comes on stdout.
    pub stderr: Option<Reader>,
    /// Sets the terminal's size (columns, rows).
    pub resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>>,
    /// The exit code (128 + the signal for a killed process).
    pub exited: oneshot::Receiver<i32>,
    /// Sends the command SIGHUP, as a terminal that went away would (the kubelet's exec does
    /// not, and a command keeps running after its caller left; a runtime's other callers may).
    pub hang_up: Option<Box<dyn FnOnce() + Send>>,
}

/// A running container's own stdin (`stdin: true` in its spec), as an attach writes to it.
pub struct AttachedInput {
    /// None once a `stdinOnce` stdin was taken, or for a terminal without stdin.
    pub stdin: Option<Writer>,
    /// Sets the size of the container's terminal (`tty: true`).
    pub resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>>,
}

/// What a container's processes use, as the kubelet's summary reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Resident memory of its processes, bytes.
    pub memory_bytes: u64,
    /// CPU time its processes have used (user and system), nanoseconds.
    pub cpu_nanoseconds: u64,
    pub processes: u64,
}

/// A boxed future, as the runtime trait returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Runs containers for the sim's kubelets.
pub trait ContainerRuntime: Send + Sync + 'static {
    /// Starts a container; an error is reported like a failed container start.
    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>>;

    /// Runs a command in a running container; an error is the runtime's own words, as the
    /// kubelet passes them on.
    fn exec(
        &self,
        context: &ContainerContext,
        request: ExecRequest,
    ) -> BoxFuture<Result<ExecSession, String>> {
        let _ = (context, request);
        Box::pin(async {
            Err("this runtime runs no processes: start the sim with a process runtime".to_owned())
        })
    }

    /// Why the container ended, when it is not its own doing (`OOMKilled`), asked once it
    /// exited.
    fn exit_reason(&self, context: &ContainerContext) -> Option<String> {
        let _ = context;
        None
    }

    /// What the container wrote to its termination message file (`terminationMessagePath`),
    /// read once it exited; None where the runtime has no files.
    fn termination_message(&self, context: &ContainerContext) -> Option<Vec<u8>> {
        let _ = context;
        None
    }

    /// The running container's stdin for an attach, when its spec asks for one (`stdin`);
    /// with `stdinOnce`, the first attach that ends closes it for good.
    fn attach(&self, context: &ContainerContext) -> Option<AttachedInput> {
        let _ = context;
        None
    }

    /// What a running container uses now (its processes' memory and CPU time), for the
    /// kubelet's `/stats/summary`; None where the runtime runs nothing to measure.
    fn usage(&self, pod_uid: &str, container: &str) -> Option<Usage> {
        let _ = (pod_uid, container);
        None
    }

    /// The pod is gone: what the runtime kept for it (its directories) can go.
    fn forget_pod(&self, pod_uid: &str) {
        let _ = pod_uid;
    }

    /// The claim is deleted: its files go.
    fn forget_claim(&self, claim_uid: &str) {
        let _ = claim_uid;
    }
}

/// Containers without processes: a main container runs until stopped (then exits 0), an
/// init container exits 0 at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdleRuntime;

impl ContainerRuntime for IdleRuntime {
    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        Box::pin(async move {
            let (exit_tx, exited) = oneshot::channel();
            let (stop, stop_rx) = oneshot::channel::<Duration>();
            if context.init {
                let _ = exit_tx.send(0);
            } else {
                tokio::spawn(async move {
                    let _ = stop_rx.await;
                    let _ = exit_tx.send(0);
                });
            }
            Ok(RunningContainer { exited, stop })
        })
    }
}

/// The runtime a cluster uses.
pub type SharedRuntime = Arc<dyn ContainerRuntime>;

/// The most a container's log keeps: its latest output, as a kubelet rotates the rest away.
pub const LOG_LIMIT: usize = 1 << 20;

/// What a container writes to its stdout and stderr, as `kubectl logs` reads it: the latest
/// `LOG_LIMIT` bytes as lines, each with when it was written (the kubelet's timestamps), and how
/// many bytes were ever written (where a follower has read to).
#[derive(Clone, Debug, Default)]
pub struct ContainerLog(Arc<Mutex<LogBuffer>>);

#[derive(Debug, Default)]
struct LogBuffer {
    /// Lines, each with its newline but the last, which may still be growing.
    lines: VecDeque<LogLine>,
    kept: usize,
    written: u64,
}

/// One line of a log and when it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct LogLine {
    pub at: jiff::Timestamp,
    pub bytes: Vec<u8>,
}

impl ContainerLog {
    fn buffer(&self) -> std::sync::MutexGuard<'_, LogBuffer> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether both are the same log (of one start of a container).
    pub fn same(&self, other: &ContainerLog) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Appends output.
    pub fn write(&self, data: &[u8]) {
        let now = jiff::Timestamp::now();
        let mut buffer = self.buffer();
        for piece in data.split_inclusive(|b| *b == b'\n') {
            match buffer.lines.back_mut() {
                Some(last) if !last.bytes.ends_with(b"\n") => last.bytes.extend(piece),
                _ => buffer.lines.push_back(LogLine {
                    at: now,
                    bytes: piece.to_vec(),
                }),
            }
        }
        buffer.kept += data.len();
        buffer.written += data.len() as u64;
        while buffer.kept > LOG_LIMIT {
            let over = buffer.kept - LOG_LIMIT;
            let Some(first) = buffer.lines.front_mut() else {
                break;
            };
            if first.bytes.len() <= over {
                let gone = first.bytes.len();
                buffer.lines.pop_front();
                buffer.kept -= gone;
            } else {
                first.bytes.drain(..over);
                buffer.kept -= over;
            }
        }
    }

    /// What is kept, and the count written so far.
    pub fn read(&self) -> (Vec<u8>, u64) {
        let (lines, written) = self.lines_since(0);
        (lines.into_iter().flat_map(|l| l.bytes).collect(), written)
    }

    /// What was written after `from` bytes (of what is still kept), and the new count.
    pub fn since(&self, from: u64) -> (Vec<u8>, u64) {
        let (lines, written) = self.lines_since(from);
        (lines.into_iter().flat_map(|l| l.bytes).collect(), written)
    }

    /// The lines (or the ends of lines) written after `from` bytes, and the new count.
    pub fn lines_since(&self, from: u64) -> (Vec<LogLine>, u64) {
        let buffer = self.buffer();
        let mut wanted = (buffer.written.saturating_sub(from) as usize).min(buffer.kept);
        let mut lines = VecDeque::new();
        for line in buffer.lines.iter().rev() {
            if wanted == 0 {
                break;
            }
            let take = line.bytes.len().min(wanted);
            lines.push_front(LogLine {
                at: line.at,
                bytes: line.bytes[line.bytes.len() - take..].to_vec(),
            });
            wanted -= take;
        }
        (lines.into(), buffer.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_keeps_its_latest_output_and_tells_a_follower_what_is_new() {
        let log = ContainerLog::default();
        log.write(b"one\n");
        let (all, at) = log.read();
        assert_eq!((all.as_slice(), at), (&b"one\n"[..], 4));
        log.write(b"two\n");
        assert_eq!(log.since(at), (b"two\n".to_vec(), 8));
        log.write(&vec![b'x'; LOG_LIMIT]);
        let (kept, written) = log.read();
        assert_eq!((kept.len(), written), (LOG_LIMIT, 8 + LOG_LIMIT as u64));
        assert!(kept.iter().all(|b| *b == b'x'));
    }

    #[test]
    fn a_log_is_lines_each_with_when_it_was_written() {
        let log = ContainerLog::default();
        log.write(b"one\ntw");
        log.write(b"o\nthree");
        let (lines, written) = log.lines_since(0);
        let texts: Vec<&[u8]> = lines.iter().map(|l| l.bytes.as_slice()).collect();
        assert_eq!(texts, [&b"one\n"[..], b"two\n", b"three"]);
        assert_eq!(written, 13);
        assert!(lines[0].at <= lines[2].at);
        let (rest, _) = log.lines_since(6);
        let texts: Vec<&[u8]> = rest.iter().map(|l| l.bytes.as_slice()).collect();
        assert_eq!(texts, [&b"o\n"[..], b"three"]);
    }
}
