//! A developer's place, measured on `berth dev` (a process of its own, as a person runs it):
//! the dashboard's list of 1 000 workspaces (time to the first byte, and to the last, of
//! `GET /` for a signed-in person), and SSH through the gateway (OpenSSH with `berth ssh
//! --stdio` as its ProxyCommand) against `kubectl exec` moving the same bytes into and out of
//! the `web` workspace's container.
//!
//! Run: `cargo bench -p berth --bench place` (`BERTH_BENCH_WORKSPACES`, default 1000;
//! `BERTH_BENCH_LISTS`, default 50; `BERTH_BENCH_SSH_MB`, default 200). Needs kubectl and
//! OpenSSH. Results go in `bench/place.md`.

use std::{
    io::{Read, Write},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `berth dev`, stopped (SIGTERM, as a person's ^C) when dropped.
struct Dev(Child);

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn poll<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One HTTP/1.0 request on a new connection: (time to the first byte, time to the last, the
/// answer).
fn timed(address: &str, text: &str) -> (Duration, Duration, Vec<u8>) {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_nodelay(true).unwrap();
    let at = Instant::now();
    stream.write_all(text.as_bytes()).unwrap();
    let mut first = [0u8; 1];
    stream.read_exact(&mut first).unwrap();
    let first_byte = at.elapsed();
    let mut rest = vec![first[0]];
    stream.read_to_end(&mut rest).unwrap();
    (first_byte, at.elapsed(), rest)
}

/// Seconds `command` takes with `bytes` zero bytes on its stdin (or none), its stdout counted;
/// (seconds, bytes it wrote).
fn through(mut command: Command, bytes: u64) -> (f64, u64) {
    let at = Instant::now();
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeding = std::thread::spawn(move || {
        let chunk = vec![0u8; 1024 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            stdin.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
    });
    let mut stdout = child.stdout.take().unwrap();
    let mut counted = 0u64;
    let mut buffer = vec![0u8; 256 * 1024];
    loop {
        match stdout.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => counted += n as u64,
        }
    }
    feeding.join().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{command:?}: {status}");
    (at.elapsed().as_secs_f64(), counted)
}

fn main() {
    let workspaces = setting("BERTH_BENCH_WORKSPACES", 1000);
    let lists = setting("BERTH_BENCH_LISTS", 50) as usize;
    let ssh_mb = setting("BERTH_BENCH_SSH_MB", 200);
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BERTH)
        .args(["dev", "--for", "900s"])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let _dev = Dev(child);
    let gateway = lines
        .by_ref()
        .map(|l| l.unwrap())
        .find_map(|l| {
            l.strip_prefix("berth dev: the gateway into workspaces:")
                .and_then(|rest| rest.split("http://").nth(1))
                .and_then(|at| at.split('/').next())
                .map(str::to_owned)
        })
        .expect("berth dev names its gateway");
    std::thread::spawn(move || for _ in lines {});
    let kubeconfig = dir.path().join("berth-dev.kubeconfig");
    let kubectl = |args: &[&str]| {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    };
    poll(Duration::from_secs(120), "web Running", || {
        let out = kubectl(&["get", "ws", "web", "-o", "jsonpath={.status.phase}"]);
        (String::from_utf8_lossy(&out.stdout) == "Running").then_some(())
    });

    // The dashboard with `workspaces` more workspaces (stopped: the list is what is measured,
    // not their pods).
    let mut manifest = String::new();
    for i in 0..workspaces {
        manifest.push_str(&format!(
            "{{\"apiVersion\": \"berth.dev/v1alpha1\", \"kind\": \"Workspace\", \"metadata\": {{\"name\": \"bench-{i:04}\"}}, \"spec\": {{\"image\": \"devbox:1\", \"paused\": true}}}}\n"
        ));
    }
    let file = dir.path().join("many.json");
    std::fs::write(&file, manifest).unwrap();
    let created = kubectl(&["create", "-f", file.to_str().unwrap()]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let port = gateway.rsplit(':').next().unwrap().to_owned();
    let host = format!("localhost:{port}");
    let link = Command::new(BERTH)
        .args(["dashboard", "--print", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    let link = String::from_utf8_lossy(&link.stdout).trim().to_owned();
    let path = link
        .strip_prefix(&format!("http://{host}"))
        .unwrap()
        .to_owned();
    let (_, _, signed_in) = timed(
        &gateway,
        &format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n"),
    );
    let signed_in = String::from_utf8_lossy(&signed_in).into_owned();
    let cookie = signed_in
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .expect("the dashboard's cookie")
        .to_owned();
    let list = format!("GET / HTTP/1.0\r\nHost: {host}\r\nCookie: {cookie}\r\n\r\n");
    let rows = |answer: &[u8]| {
        String::from_utf8_lossy(answer)
            .matches("<tr data-workspace=")
            .count()
    };
    let expected = workspaces as usize;
    poll(
        Duration::from_secs(60),
        "the gateway's cache to hold them",
        || {
            let (_, _, answer) = timed(&gateway, &list);
            (rows(&answer) > expected).then_some(())
        },
    );
    let (mut first, mut last) = (vec![], vec![]);
    let mut size = 0;
    for _ in 0..lists {
        let (f, l, answer) = timed(&gateway, &list);
        assert!(rows(&answer) > expected);
        size = answer.len();
        first.push(f);
        last.push(l);
    }
    first.sort();
    last.sort();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| dashboard `GET /`, {} workspaces ({} KiB), first byte p50 / p99 | {} / {} |",
        expected + 20,
        size / 1024,
        ms(percentile(&first, 0.5)),
        ms(percentile(&first, 0.99))
    );
    println!(
        "| the same, last byte p50 / p99 | {} / {} |",
        ms(percentile(&last, 0.5)),
        ms(percentile(&last, 0.99))
    );

    // SSH through the gateway against kubectl exec, the same bytes each way.
    let known_hosts = dir.path().join("known_hosts");
    let config = Command::new(BERTH)
        .args(["ssh-config", "web", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--known-hosts")
        .arg(&known_hosts)
        .output()
        .unwrap();
    assert!(
        config.status.success(),
        "{}",
        String::from_utf8_lossy(&config.stderr)
    );
    let ssh_config = dir.path().join("ssh_config");
    std::fs::write(&ssh_config, &config.stdout).unwrap();
    let bytes = ssh_mb * 1024 * 1024;
    let ssh = |remote: &str| {
        let mut command = Command::new("ssh");
        command
            .arg("-F")
            .arg(&ssh_config)
            .args(["-o", "BatchMode=yes", "berth--web", remote]);
        command
    };
    let exec = |remote: &str| {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["exec", "-i", "web-ws", "--", "sh", "-c", remote])
            .env_remove("KUBECONFIG");
        command
    };
    let download = format!("head -c {bytes} /dev/zero");
    let rate = |(seconds, _): (f64, u64)| ssh_mb as f64 / seconds;
    let mut rows_out = vec![];
    for (what, up) in [("upload", true), ("download", false)] {
        let (ssh_rate, exec_rate) = if up {
            (
                rate(through(ssh("cat > /dev/null"), bytes)),
                rate(through(exec("cat > /dev/null"), bytes)),
            )
        } else {
            let ssh_run = through(ssh(&download), 0);
            let exec_run = through(exec(&download), 0);
            assert_eq!((ssh_run.1, exec_run.1), (bytes, bytes));
            (rate(ssh_run), rate(exec_run))
        };
        rows_out.push(format!(
            "| {ssh_mb} MB {what}: ssh through the gateway / kubectl exec | {ssh_rate:.0} MB/s / {exec_rate:.0} MB/s ({:.0} %) |",
            100.0 * ssh_rate / exec_rate
        ));
    }
    for row in rows_out {
        println!("{row}");
    }
}
