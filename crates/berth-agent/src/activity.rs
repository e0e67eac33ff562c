//! What the workspace is doing, measured in the pod, for idle culling: an established TCP
//! connection to one of its declared ports (from `/proc/net/tcp*` of the pod's network
//! namespace), CPU used by the supervised processes above a threshold, `Heartbeat` calls, and
//! shells open through the `Shell` RPC (an open shell counts at every sample, as an open
//! connection does).
//! `GetActivity` reports the latest of them; until one happens, the agent's own start.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::Mutex,
    time::{Duration, Instant},
};

use jiff::Timestamp;
use procfs::net::TcpState;

/// Which signal the latest activity was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Nothing happened since the agent started.
    Started,
    /// A connection to a declared port was open.
    Connection,
    /// The supervised processes used CPU above the threshold.
    Cpu,
    /// Someone called `Heartbeat`.
    Heartbeat,
    /// A shell was open.
    Shell,
}

impl Signal {
    /// The name `GetActivity` reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Started => "Started",
            Signal::Connection => "Connection",
            Signal::Cpu => "Cpu",
            Signal::Heartbeat => "Heartbeat",
            Signal::Shell => "Shell",
        }
    }
}

/// One activity: when, which signal, and in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub at: Timestamp,
    pub signal: Signal,
    pub detail: String,
}

/// What counts as activity.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The workspace's declared ports: a connection to one of them is activity (never the
    /// agent's own port, which the operator calls).
    pub ports: Vec<u16>,
    /// Only connections to this local address count (the pod IP where pods share a network
    /// namespace, as in the simulator); any address in a pod of its own.
    pub address: Option<IpAddr>,
    /// CPU of the supervised processes, in cores, at or above which they count as busy.
    pub cpu_threshold: f64,
    /// How often connections and CPU are sampled in the background.
    pub interval: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ports: vec![],
            address: None,
            cpu_threshold: DEFAULT_CPU_THRESHOLD,
            interval: Duration::from_secs(5),
        }
    }
}

/// 5% of one core: an editor's idle housekeeping stays below it, a build or a test run does not.
pub const DEFAULT_CPU_THRESHOLD: f64 = 0.05;

/// The most characters of a heartbeat's source that are kept.
pub const MAX_SOURCE: usize = 64;

/// The CPU ticks of the supervised tree at a sample.
struct CpuSample {
    at: Instant,
    ticks: u64,
}

/// The workspace's activity, as the agent measures it.
pub struct Activity {
    settings: Settings,
    latest: Mutex<Seen>,
    /// The supervised command's process, the root of the tree whose CPU counts.
    supervised: Mutex<Option<i32>>,
    cpu: Mutex<Option<CpuSample>>,
    /// Shells open now, by the user they were opened for.
    shells: Mutex<HashMap<String, usize>>,
}

/// An open shell, counted until dropped.
pub struct ShellOpen {
    activity: std::sync::Arc<Activity>,
    user: String,
}

impl Drop for ShellOpen {
    fn drop(&mut self) {
        let mut shells = lock(&self.activity.shells);
        if let Some(open) = shells.get_mut(&self.user) {
            *open -= 1;
            if *open == 0 {
                shells.remove(&self.user);
            }
        }
    }
}

fn shell_detail(user: &str) -> String {
    match user.is_empty() {
        true => "a shell".to_owned(),
        false => format!("a shell for {user}"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Activity {
    /// Activity measured with `settings`; until something happens, the latest is the start.
    pub fn new(settings: Settings) -> Self {
        Activity {
            settings,
            latest: Mutex::new(Seen {
                at: Timestamp::now(),
                signal: Signal::Started,
                detail: "the agent started".to_owned(),
            }),
            supervised: Mutex::new(None),
            cpu: Mutex::new(None),
            shells: Mutex::new(HashMap::new()),
        }
    }

    /// A shell opened for `user`: activity now, and at every sample until the guard is
    /// dropped.
    pub fn shell_opened(self: &std::sync::Arc<Self>, user: &str) -> ShellOpen {
        let user: String = user
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_SOURCE)
            .collect();
        *lock(&self.shells).entry(user.clone()).or_default() += 1;
        self.record(Signal::Shell, shell_detail(&user));
        ShellOpen {
            activity: self.clone(),
            user,
        }
    }

    /// Input typed into a shell of `guard`'s: activity now.
    pub fn shell_used(&self, guard: &ShellOpen) {
        self.record(Signal::Shell, shell_detail(&guard.user));
    }

    fn sample_shells(&self) {
        let user = lock(&self.shells).keys().next().cloned();
        if let Some(user) = user {
            self.record(Signal::Shell, shell_detail(&user));
        }
    }

    /// The process whose tree's CPU counts (the workspace's command).
    pub fn supervise(&self, pid: i32) {
        *lock(&self.supervised) = Some(pid);
        *lock(&self.cpu) = None;
    }

    /// Records activity now, unless a later one is already recorded.
    pub fn record(&self, signal: Signal, detail: String) {
        let now = Timestamp::now();
        let mut latest = lock(&self.latest);
        if now >= latest.at {
            *latest = Seen {
                at: now,
                signal,
                detail,
            };
        }
    }

    /// A heartbeat from `source` (a caller's own words, shortened).
    pub fn heartbeat(&self, source: &str) {
        let source: String = source
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_SOURCE)
            .collect();
        let detail = match source.is_empty() {
            true => "a heartbeat".to_owned(),
            false => format!("a heartbeat from {source}"),
        };
        self.record(Signal::Heartbeat, detail);
    }

    /// The latest activity, with the connections open right now taken into account.
    pub fn latest(&self) -> Seen {
        self.sample_connections();
        self.sample_shells();
        lock(&self.latest).clone()
    }

    /// Samples connections and CPU once.
    pub fn sample(&self) {
        self.sample_connections();
        self.sample_shells();
        self.sample_cpu();
    }

    /// Samples every `interval`, forever (the caller aborts the task).
    pub async fn run(self: std::sync::Arc<Self>) {
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.sample();
        }
    }

    fn sample_connections(&self) {
        if self.settings.ports.is_empty() {
            return;
        }
        if let Some(local) = open_connection(&self.settings.ports, self.settings.address) {
            self.record(
                Signal::Connection,
                format!("a connection to port {}", local.port()),
            );
        }
    }

    fn sample_cpu(&self) {
        let Some(root) = *lock(&self.supervised) else {
            return;
        };
        let now = Instant::now();
        let ticks = tree_ticks(root);
        let mut last = lock(&self.cpu);
        if let Some(before) = last.as_ref() {
            let cores = cores_used(
                ticks.saturating_sub(before.ticks),
                now - before.at,
                procfs::ticks_per_second(),
            );
            if cores >= self.settings.cpu_threshold && cores > 0.0 {
                self.record(
                    Signal::Cpu,
                    format!(
                        "the workspace's processes used {:.0}% of a core",
                        cores * 100.0
                    ),
                );
            }
        }
        *last = Some(CpuSample { at: now, ticks });
    }
}

/// The cores that `ticks` of CPU over `elapsed` amount to.
pub fn cores_used(ticks: u64, elapsed: Duration, ticks_per_second: u64) -> f64 {
    if elapsed.is_zero() || ticks_per_second == 0 {
        return 0.0;
    }
    ticks as f64 / ticks_per_second as f64 / elapsed.as_secs_f64()
}

/// The local end of an established connection to one of `ports` (at `address`, when given),
/// from the network namespace's `/proc/net/tcp` and `/proc/net/tcp6`.
pub fn open_connection(ports: &[u16], address: Option<IpAddr>) -> Option<SocketAddr> {
    let entries = procfs::net::tcp()
        .unwrap_or_default()
        .into_iter()
        .chain(procfs::net::tcp6().unwrap_or_default());
    established_to(entries.map(|e| (e.local_address, e.state)), ports, address)
}

/// The first established connection among `entries` whose local end is one of `ports` (at
/// `address`, when given; an IPv4 address also matches its IPv6-mapped form).
pub fn established_to(
    entries: impl IntoIterator<Item = (SocketAddr, TcpState)>,
    ports: &[u16],
    address: Option<IpAddr>,
) -> Option<SocketAddr> {
    let same = |local: IpAddr, wanted: IpAddr| match (local, wanted) {
        (IpAddr::V6(v6), IpAddr::V4(v4)) => v6.to_ipv4_mapped() == Some(v4),
        (local, wanted) => local == wanted,
    };
    entries.into_iter().find_map(|(local, state)| {
        (state == TcpState::Established
            && ports.contains(&local.port())
            && address.is_none_or(|a| same(local.ip(), a)))
        .then_some(local)
    })
}

/// The CPU ticks (user and system, reaped children included) of `root` and every process
/// below it.
pub fn tree_ticks(root: i32) -> u64 {
    let Ok(processes) = procfs::process::all_processes() else {
        return 0;
    };
    let stats: Vec<_> = processes
        .filter_map(|p| p.ok()?.stat().ok())
        .map(|s| {
            let ticks = s.utime + s.stime + s.cutime.max(0) as u64 + s.cstime.max(0) as u64;
            (s.pid, s.ppid, ticks)
        })
        .collect();
    sum_below(root, &stats)
}

/// The ticks of `root` and its descendants among `(pid, parent, ticks)`.
pub fn sum_below(root: i32, processes: &[(i32, i32, u64)]) -> u64 {
    let mut children: HashMap<i32, Vec<(i32, u64)>> = HashMap::new();
    let mut own = None;
    for &(pid, parent, ticks) in processes {
        if pid == root {
            own = Some(ticks);
        }
        children.entry(parent).or_default().push((pid, ticks));
    }
    let Some(own) = own else {
        return 0;
    };
    let (mut total, mut todo) = (own, vec![root]);
    while let Some(pid) = todo.pop() {
        for &(child, ticks) in children.get(&pid).into_iter().flatten() {
            if child != root {
                total += ticks;
                todo.push(child);
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn only_established_connections_to_declared_ports_count() {
        let entries = [
            (at("0.0.0.0:8080"), TcpState::Listen),
            (at("127.0.0.5:50051"), TcpState::Established),
            (at("127.0.0.5:8080"), TcpState::TimeWait),
        ];
        assert_eq!(established_to(entries, &[8080], None), None);
        let entries = [(at("127.0.0.5:8080"), TcpState::Established)];
        assert_eq!(
            established_to(entries, &[3000, 8080], None),
            Some(at("127.0.0.5:8080"))
        );
    }

    #[test]
    fn an_address_limits_connections_to_that_pod_ip_in_either_family() {
        let pod = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 5));
        let other = [(at("127.0.0.6:8080"), TcpState::Established)];
        assert_eq!(established_to(other, &[8080], Some(pod)), None);
        let mapped = SocketAddr::new(
            IpAddr::V6(Ipv4Addr::new(127, 0, 0, 5).to_ipv6_mapped()),
            8080,
        );
        assert_eq!(
            established_to([(mapped, TcpState::Established)], &[8080], Some(pod)),
            Some(mapped)
        );
        let v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 8080);
        assert_eq!(
            established_to([(v6, TcpState::Established)], &[8080], None),
            Some(v6)
        );
    }

    #[test]
    fn a_tree_sums_its_descendants_and_nothing_else() {
        // 10 -> 11 -> 12, 10 -> 13; 20 is not below 10.
        let processes = [
            (1, 0, 1000),
            (10, 1, 5),
            (11, 10, 7),
            (12, 11, 11),
            (13, 10, 2),
            (20, 1, 500),
        ];
        assert_eq!(sum_below(10, &processes), 25);
        assert_eq!(sum_below(11, &processes), 18);
        assert_eq!(sum_below(99, &processes), 0, "a process that is gone");
    }

    #[test]
    fn cpu_is_counted_in_cores() {
        assert_eq!(cores_used(50, Duration::from_secs(1), 100), 0.5);
        assert_eq!(cores_used(0, Duration::from_secs(1), 100), 0.0);
        assert_eq!(cores_used(10, Duration::ZERO, 100), 0.0);
    }

    fn watching(ports: Vec<u16>, address: Option<IpAddr>) -> Activity {
        Activity::new(Settings {
            ports,
            address,
            ..Settings::default()
        })
    }

    #[test]
    fn nothing_happened_means_the_start() {
        let activity = watching(vec![], None);
        assert_eq!(activity.latest().signal, Signal::Started);
    }

    #[test]
    fn a_real_connection_to_a_declared_port_is_activity_until_it_closes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let pod = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let activity = watching(vec![port], pod);
        assert_eq!(
            activity.latest().signal,
            Signal::Started,
            "listening is not use"
        );

        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (served, _) = listener.accept().unwrap();
        let seen = activity.latest();
        assert_eq!(seen.signal, Signal::Connection);
        assert_eq!(seen.detail, format!("a connection to port {port}"));

        // Another pod's address, or another port, is not this workspace's.
        let elsewhere = watching(vec![port], Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9))));
        assert_eq!(elsewhere.latest().signal, Signal::Started);
        let other_port = watching(vec![port.wrapping_add(1)], pod);
        assert_eq!(other_port.latest().signal, Signal::Started);

        drop((client, served));
        let closed = watching(vec![port], pod);
        assert_eq!(
            closed.latest().signal,
            Signal::Started,
            "a closed connection is gone from /proc/net/tcp"
        );
    }

    #[test]
    fn a_busy_supervised_process_is_activity_and_a_sleeping_one_is_not() {
        let sample = |command: &str| {
            let mut child = std::process::Command::new("sh")
                .args(["-c", command])
                .spawn()
                .unwrap();
            let activity = watching(vec![], None);
            activity.supervise(child.id() as i32);
            activity.sample();
            std::thread::sleep(Duration::from_millis(500));
            activity.sample();
            let _ = child.kill();
            let _ = child.wait();
            activity.latest()
        };
        let busy = sample("while :; do :; done");
        assert_eq!(busy.signal, Signal::Cpu, "{busy:?}");
        assert!(busy.detail.contains("% of a core"), "{}", busy.detail);
        assert_eq!(sample("sleep 5").signal, Signal::Started);
    }

    #[test]
    fn a_busy_grandchild_counts_for_the_tree() {
        let mut child = std::process::Command::new("sh")
            // Bounded, so a failing test leaves nothing spinning.
            .args(["-c", "timeout 3 sh -c 'while :; do :; done'; true"])
            .spawn()
            .unwrap();
        let activity = watching(vec![], None);
        activity.supervise(child.id() as i32);
        activity.sample();
        std::thread::sleep(Duration::from_millis(500));
        activity.sample();
        let seen = activity.latest();
        let _ = child.wait();
        assert_eq!(seen.signal, Signal::Cpu, "{seen:?}");
    }

    #[test]
    fn heartbeats_name_their_source_briefly() {
        let activity = watching(vec![], None);
        activity.heartbeat("vscode");
        let seen = activity.latest();
        assert_eq!(seen.signal, Signal::Heartbeat);
        assert_eq!(seen.detail, "a heartbeat from vscode");
        activity.heartbeat(&"x\n".repeat(200));
        let long = activity.latest().detail;
        assert_eq!(long, format!("a heartbeat from {}", "x".repeat(MAX_SOURCE)));
        activity.heartbeat("");
        assert_eq!(activity.latest().detail, "a heartbeat");
    }
}
