//! The runtime where containers are processes: a container's command runs on the host (an
//! image names nothing there: the host's `/usr`, `/bin`, `/lib` and `/etc` stand in for it,
//! read-only), in a root of its own with its volumes at their mount paths, in a mount namespace
//! of its own (in a user namespace when not root). Claims are directories of the runtime's data
//! directory that live as long as the claim; `emptyDir`s and written files live with the pod.

use std::{
    collections::HashMap,
    ffi::CString,
    os::unix::{
        ffi::OsStrExt,
        fs::{MetadataExt, PermissionsExt},
        process::ExitStatusExt,
    },
    path::{Component, Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::Value;
use tokio::sync::oneshot;

use crate::runtime::{
    AttachedInput, BoxFuture, ContainerContext, ContainerRuntime, ExecRequest, ExecSession,
    IdleRuntime, Reader, RunningContainer, VolumeMount, VolumeSource, Writer,
};

/// The host's folders a container shares, read-only but for the kernel's own.
const SYSTEM: &[(&str, bool)] = &[
    ("bin", true),
    ("sbin", true),
    ("lib", true),
    ("lib32", true),
    ("lib64", true),
    ("libx32", true),
    ("usr", true),
    ("etc", true),
    ("opt", true),
    ("proc", false),
    ("sys", false),
];

/// The devices a container runtime gives a container's `/dev`, from the host's.
const DEVICES: &[&str] = &[
    "null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm",
];

/// The links a container's `/dev` has.
const DEVICE_LINKS: &[(&str, &str)] = &[
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];

/// Where a container's termination message is read from, unless it says otherwise.
const TERMINATION_LOG: &str = "/dev/termination-log";

/// The most of a termination message the kubelet keeps.
const TERMINATION_MESSAGE_LIMIT: usize = 4096;

/// What an image's config usually sets, when the container does not.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs containers as processes; a container with neither command nor args runs nothing (its
/// image's entrypoint is not on the host) until stopped, but can be entered with exec.
#[derive(Clone)]
pub struct ProcessRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    data: PathBuf,
    /// Containers killed for going over their memory limit, by (pod UID, container name),
    /// until the kubelet asks why they ended.
    oom_killed: Mutex<std::collections::HashSet<(String, String)>>,
    /// The layout of each running container, by (pod UID, container name), for exec.
    layouts: Mutex<HashMap<(String, String), Arc<Layout>>>,
    /// Images that have what the host lacks: files, an entrypoint.
    images: Vec<Image>,
    /// Claims whose folder is a filesystem of their size (as root), by UID: that size.
    bounded: Mutex<HashMap<String, u64>>,
    /// The stdin of each running container whose spec asks for one, by (pod UID, container).
    stdins: Mutex<HashMap<(String, String), ContainerStdin>>,
    /// The process group of each running container's main process, by (pod UID, container).
    groups: Mutex<HashMap<(String, String), u32>>,
}

/// A running container's stdin: a pipe, or its terminal's controller side.
struct ContainerStdin {
    /// None for a terminal without stdin, kept for its size.
    file: Option<std::fs::File>,
    /// With a terminal, its controller side again, to set its size.
    terminal: Option<Arc<std::fs::File>>,
    /// `stdinOnce`: the first attach takes it, and closes it when it ends.
    once: bool,
}

impl Drop for Inner {
    /// A claim's filesystem goes with the runtime, as its folders do.
    fn drop(&mut self) {
        let bounded = std::mem::take(self.bounded.get_mut().unwrap_or_else(|p| p.into_inner()));
        for uid in bounded.keys() {
            unmount(&self.data.join("claims").join(uid));
        }
    }
}

/// Detaches the filesystem mounted at `dir`, if any.
fn unmount(dir: &Path) {
    if let Ok(path) = CString::new(dir.as_os_str().as_bytes()) {
        // SAFETY: a valid C string; MNT_DETACH unmounts even while a process still uses it.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// What the images a matcher accepts have beyond the host: files (a host file bound read-only
/// where the image has it, as Berth's image has `/usr/local/bin/berth`) and an entrypoint.
struct Image {
    matches: Box<dyn Fn(&str) -> bool + Send + Sync>,
    /// (path in the container, relative; the host's file).
    files: Vec<(PathBuf, PathBuf)>,
    entrypoint: Vec<String>,
}

/// What a process of a container sees, prepared on the host before it forks.
struct Layout {
    root: PathBuf,
    /// (source, target inside the root, read-only)
    binds: Vec<(PathBuf, PathBuf, bool)>,
    workdir: String,
    env: Vec<(String, String)>,
    user: Option<User>,
}

/// A container's key: (pod UID, container name).
fn key(context: &ContainerContext) -> (String, String) {
    (
        context.pod_uid.clone(),
        context.container["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// Who the process runs as, from the security context (only when the sim runs as root).
#[derive(Clone, Copy, Debug, PartialEq)]
struct User {
    uid: u32,
    gid: u32,
    fs_group: Option<u32>,
    /// May bind ports below 1024 (`CAP_NET_BIND_SERVICE`, in a container runtime's default
    /// set): the image's user, the stand-in for an image's root, unless the container drops it.
    binds_low_ports: bool,
}

fn c_path(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// A path inside the container, as a relative path without `..`; None if it leaves the root.
fn inside(path: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// The container's command line: `command` then `args`.
fn argv(container: &Value) -> Vec<String> {
    ["command", "args"]
        .iter()
        .flat_map(|key| container[key].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect()
}

/// The user the sim's images run as (their `USER`): nobody. A container never runs as the
/// sim's own user (root, where the sim runs as root) unless its security context says so.
pub const IMAGE_USER: u32 = 65534;

/// The user a container runs as: the container's security context over the pod's, else the
/// image's user ([`IMAGE_USER`]).
fn user(context: &ContainerContext) -> User {
    let pod = &context.pod["spec"]["securityContext"];
    let container = &context.container["securityContext"];
    let field = |name: &str| {
        container[name]
            .as_u64()
            .or_else(|| pod[name].as_u64())
            .and_then(|v| u32::try_from(v).ok())
    };
    let uid = field("runAsUser").unwrap_or(IMAGE_USER);
    let capabilities = &container["capabilities"];
    let listed = |list: &str, name: &str| {
        capabilities[list]
            .as_array()
            .is_some_and(|l| l.iter().any(|c| c == name || c == &format!("CAP_{name}")))
    };
    let dropped = listed("drop", "ALL") || listed("drop", "NET_BIND_SERVICE");
    User {
        uid,
        gid: field("runAsGroup").unwrap_or(if uid == IMAGE_USER { IMAGE_USER } else { 0 }),
        fs_group: pod["fsGroup"].as_u64().and_then(|v| u32::try_from(v).ok()),
        binds_low_ports: listed("add", "NET_BIND_SERVICE") || (uid == IMAGE_USER && !dropped),
    }
}

/// Keeps `CAP_NET_BIND_SERVICE` across the switch to a container's user, as an ambient
/// capability its command inherits; called between `PR_SET_KEEPCAPS` and the `setuid` it
/// survived. Best effort: where the sim holds no such capability, nothing changes.
///
/// # Safety
/// Only between fork and exec (async-signal-safe calls only).
unsafe fn keep_bind_service() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const NET_BIND_SERVICE: u32 = 10;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let bit = 1u32 << NET_BIND_SERVICE;
    let data = [
        Data {
            effective: bit,
            permitted: bit,
            inheritable: bit,
        },
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: the header and the two data words are the kernel's v3 layout.
    unsafe {
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) == 0 {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                NET_BIND_SERVICE as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            );
        }
    }
}

/// Removes a folder the runtime made, never crossing into another file system (a mount that
/// should not be there).
fn remove_tree(path: &Path) {
    fn remove(path: &Path, device: u64) {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return;
        };
        if meta.dev() != device {
            return;
        }
        if meta.is_dir() {
            // A folder its owner made unreadable is still ours to remove.
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
            for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
                remove(&entry.path(), device);
            }
            let _ = std::fs::remove_dir(path);
        } else {
            let _ = std::fs::remove_file(path);
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        remove(path, meta.dev());
    }
}

/// Writes `text` to a file, between fork and exec (no allocation).
fn write_file(path: &CString, text: &[u8]) -> std::io::Result<()> {
    // SAFETY: `path` is a valid C string; the descriptor is closed before returning.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = libc::write(fd, text.as_ptr().cast(), text.len());
        libc::close(fd);
        if written < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn check(result: libc::c_int) -> std::io::Result<()> {
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Everything the child does between fork and exec, as C strings made before the fork.
struct Enter {
    /// A user namespace mapping our own uid and gid, when not root.
    maps: Option<(CString, CString)>,
    setgroups: CString,
    uid_map: CString,
    gid_map: CString,
    binds: Vec<(CString, CString, bool)>,
    root: CString,
    workdir: CString,
    user: Option<User>,
    /// The terminal to make the controlling one (its descriptor is stdin).
    tty: bool,
}

impl Enter {
    fn new(layout: &Layout, tty: bool) -> std::io::Result<Self> {
        // SAFETY: getuid and getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let binds = layout
            .binds
            .iter()
            .map(|(source, target, read_only)| {
                Ok((
                    c_path(source)?,
                    c_path(&layout.root.join(target))?,
                    *read_only,
                ))
            })
            .collect::<std::io::Result<_>>()?;
        let text = |s: String| CString::new(s).map_err(std::io::Error::other);
        Ok(Enter {
            maps: match uid {
                0 => None,
                _ => Some((
                    text(format!("{uid} {uid} 1"))?,
                    text(format!("{gid} {gid} 1"))?,
                )),
            },
            setgroups: text("/proc/self/setgroups".into())?,
            uid_map: text("/proc/self/uid_map".into())?,
            gid_map: text("/proc/self/gid_map".into())?,
            binds,
            root: c_path(&layout.root)?,
            workdir: text(layout.workdir.clone())?,
            // Only root can become another user; in a user namespace we are our own uid.
            user: layout.user.filter(|_| uid == 0),
            tty,
        })
    }

    /// In the child: its own session, its own mounts, its root, its user.
    fn enter(&self) -> std::io::Result<()> {
        // SAFETY: plain system calls on C strings prepared before the fork.
        unsafe {
            check(libc::setsid())?;
            if self.tty {
                check(libc::ioctl(0, libc::TIOCSCTTY, 0))?;
            }
            // A container goes with the sim, however it ends.
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))?;
            // The host's set-user-ID programs (sudo, su, in the shared /usr) never make it
            // root again: no new privileges, as allowPrivilegeEscalation: false asks.
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            // A container's process starts with every signal at its default and none blocked,
            // as a runtime starts it, whatever the sim inherited (nohup ignores SIGHUP).
            for signal in 1..libc::SIGRTMIN() {
                if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                    libc::signal(signal, libc::SIG_DFL);
                }
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            check(libc::sigprocmask(
                libc::SIG_SETMASK,
                &none,
                std::ptr::null_mut(),
            ))?;
            let flags = match self.maps {
                Some(_) => libc::CLONE_NEWUSER | libc::CLONE_NEWNS,
                None => libc::CLONE_NEWNS,
            };
            check(libc::unshare(flags))?;
            if let Some((uid_map, gid_map)) = &self.maps {
                write_file(&self.setgroups, b"deny")?;
                write_file(&self.uid_map, uid_map.as_bytes())?;
                write_file(&self.gid_map, gid_map.as_bytes())?;
            }
            // Nothing mounted here may reach the host's namespace.
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            for (source, target, read_only) in &self.binds {
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                if *read_only {
                    // Best effort: a locked mount of a user namespace may refuse it.
                    libc::mount(
                        std::ptr::null(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_REC,
                        std::ptr::null(),
                    );
                }
            }
            check(libc::chroot(self.root.as_ptr()))?;
            check(libc::chdir(self.workdir.as_ptr()))?;
            if let Some(user) = self.user {
                let groups: [libc::gid_t; 1] = [user.fs_group.unwrap_or(user.gid)];
                check(libc::setgroups(1, groups.as_ptr()))?;
                check(libc::setgid(user.gid))?;
                if user.binds_low_ports {
                    libc::prctl(libc::PR_SET_KEEPCAPS, 1 as libc::c_ulong, 0, 0, 0);
                }
                check(libc::setuid(user.uid))?;
                if user.binds_low_ports {
                    keep_bind_service();
                }
            }
        }
        Ok(())
    }
}

/// The words of a runtime that could not start `program`, as containerd's runc says them.
fn start_error(program: &str, error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => {
            format!("exec: \"{program}\": executable file not found in $PATH: unknown")
        }
        std::io::ErrorKind::PermissionDenied => {
            format!("exec: \"{program}\": permission denied: unknown")
        }
        _ => format!("{error}: unknown"),
    }
}

/// Sends `signal` to every process of the group `pid` leads.
fn signal_group(pid: Option<u32>, signal: libc::c_int) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: a signal to a process group we made; at worst it is gone (ESRCH).
        unsafe { libc::kill(-pid, signal) };
    }
}

/// A container's process group, killed when dropped.
struct Group(Option<u32>);

impl Drop for Group {
    fn drop(&mut self) {
        signal_group(self.0, libc::SIGKILL);
    }
}

/// An exit status as a kubelet reports it: the code, or 128 + the signal.
fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> i32 {
    match status {
        Ok(status) => status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(libc::SIGKILL)),
        Err(_) => 128 + libc::SIGKILL,
    }
}

/// Copies a process's output into the container's log.
fn log_output(
    output: Option<impl tokio::io::AsyncRead + Send + Unpin + 'static>,
    log: crate::ContainerLog,
) {
    let Some(mut output) = output else { return };
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 8192];
        while let Ok(n) = output.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            log.write(&chunk[..n]);
        }
    });
}

/// A pseudo-terminal: the controller's side (read and write halves) and the terminal's path.
struct Terminal {
    controller: std::fs::File,
    terminal: std::fs::File,
}

fn open_terminal() -> std::io::Result<Terminal> {
    use std::os::fd::FromRawFd;
    // SAFETY: the usual posix_openpt sequence; every descriptor is owned by a File at once.
    unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let controller = std::fs::File::from_raw_fd(fd);
        check(libc::grantpt(fd))?;
        check(libc::unlockpt(fd))?;
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(fd, name.as_mut_ptr(), name.len()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let path = std::ffi::CStr::from_ptr(name.as_ptr());
        let tfd = libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if tfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Terminal {
            controller,
            terminal: std::fs::File::from_raw_fd(tfd),
        })
    }
}

fn set_size(fd: std::os::fd::RawFd, columns: u16, rows: u16) {
    let size = libc::winsize {
        ws_row: rows,
        ws_col: columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer.
    unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &size) };
}

impl ProcessRuntime {
    /// A runtime keeping claims and pods' folders under `data`.
    pub fn new(data: impl Into<PathBuf>) -> Self {
        ProcessRuntime {
            inner: Arc::new(Inner {
                data: data.into(),
                oom_killed: Mutex::default(),
                layouts: Mutex::default(),
                images: vec![],
                bounded: Mutex::default(),
                stdins: Mutex::default(),
                groups: Mutex::default(),
            }),
        }
    }

    /// Containers of the images `image` accepts find each host file of `files` at its path
    /// (absolute, read-only) and, without a `command`, run `entrypoint` before their `args`,
    /// as if their image had them (`{podIP}` in it is the pod's address, which a server must
    /// listen on where pods share this machine's network). Call before the runtime is shared.
    pub fn with_image(
        self,
        image: impl Fn(&str) -> bool + Send + Sync + 'static,
        files: &[(&str, PathBuf)],
        entrypoint: &[&str],
    ) -> Self {
        let mut inner = Arc::try_unwrap(self.inner)
            .unwrap_or_else(|_| panic!("with_image is called before the runtime is shared"));
        inner.images.push(Image {
            matches: Box::new(image),
            files: files
                .iter()
                .map(|(path, host)| (inside(path).unwrap_or_default(), host.clone()))
                .collect(),
            entrypoint: entrypoint.iter().map(|s| (*s).to_owned()).collect(),
        });
        ProcessRuntime {
            inner: Arc::new(inner),
        }
    }

    fn image(&self, context: &ContainerContext) -> Option<&Image> {
        let image = context.container["image"].as_str().unwrap_or_default();
        self.inner.images.iter().find(|i| (i.matches)(image))
    }

    /// The container's command line: `command` then `args`, or without a command the image's
    /// entrypoint (where known) then `args`.
    fn command_line(&self, context: &ContainerContext) -> Vec<String> {
        let mut words = argv(&context.container);
        if context.container["command"].is_null()
            && let Some(image) = self.image(context)
        {
            // Pods share this machine's network here, so an image's server listens on its
            // pod's address: `{podIP}` in an entrypoint is that address.
            let pod_ip = context.pod_ip.to_string();
            words.splice(
                0..0,
                image
                    .entrypoint
                    .iter()
                    .map(|w| w.replace("{podIP}", &pod_ip)),
            );
        }
        words
    }

    fn pod_dir(&self, pod_uid: &str) -> PathBuf {
        self.inner.data.join("pods").join(pod_uid)
    }

    /// The file a container's termination message is written to (outside its root, which a
    /// restart replaces).
    fn termination_file(&self, pod_uid: &str, container: &str) -> PathBuf {
        self.pod_dir(pod_uid)
            .join("containers")
            .join(format!("{container}.termination-log"))
    }

    /// A claim's folder, whichever pod mounts it.
    pub fn claim_dir(&self, claim_uid: &str) -> PathBuf {
        self.inner.data.join("claims").join(claim_uid)
    }

    /// A claim's folder as a container mounting it sees it: bounded to its capacity first
    /// where claims are (so what is written before the container's processes start is not
    /// hidden under the filesystem they get).
    pub fn claim_folder(&self, claim_uid: &str, capacity: Option<u64>) -> std::io::Result<PathBuf> {
        let dir = self.claim_dir(claim_uid);
        match capacity {
            Some(capacity) => self.bound_claim(claim_uid, &dir, capacity)?,
            None => std::fs::create_dir_all(&dir)?,
        }
        Ok(dir)
    }

    /// Whether a claim fills up at its capacity (`ENOSPC`): where the sim runs as root, a
    /// claim's folder is a filesystem of the claim's size. Elsewhere claims are plain folders.
    pub fn bounds_claims(&self) -> bool {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    fn lock_bounded(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.inner.bounded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes a claim's folder a filesystem of `capacity` bytes (a tmpfs, which holds only
    /// what is written), or grows it to a new capacity as a volume expansion does.
    fn bound_claim(&self, uid: &str, dir: &Path, capacity: u64) -> std::io::Result<()> {
        if !self.bounds_claims() {
            return Ok(());
        }
        let mut bounded = self.lock_bounded();
        let current = bounded.get(uid).copied();
        if current == Some(capacity) {
            return Ok(());
        }
        std::fs::create_dir_all(dir)?;
        let target = CString::new(dir.as_os_str().as_bytes())?;
        let options = CString::new(format!("size={capacity},mode=0777"))?;
        let fstype = c"tmpfs";
        let flags = match current {
            Some(_) => libc::MS_REMOUNT,
            None => 0,
        };
        // SAFETY: valid C strings; a tmpfs mount on a folder of the runtime's own.
        let done = unsafe {
            libc::mount(
                fstype.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                flags | libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            )
        };
        if done != 0 {
            return Err(std::io::Error::last_os_error());
        }
        bounded.insert(uid.to_owned(), capacity);
        Ok(())
    }

    /// Whether this machine lets a container have its own mount namespace (as root, or in a
    /// user namespace): runs `sh -c :` as a container would run.
    pub async fn check_isolation(&self) -> Result<(), String> {
        let context = probe_context();
        let uid = context.pod_uid.clone();
        let started = self.lay_out(&context).and_then(|layout| {
            let argv = ["sh".into(), "-c".into(), ":".into()];
            self.spawn_in(&layout, &argv, Stdio::null(), None)
        });
        let result = match started {
            Ok(mut child) => {
                match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
                    Ok(Ok(status)) if status.success() => Ok(()),
                    Ok(Ok(status)) => Err(format!("a namespaced sh -c : exited with {status}")),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("a namespaced sh -c : did not exit within 10 s".to_owned()),
                }
            }
            Err(e) => Err(format!(
                "this machine allows no mount namespace for a container's process: {e}"
            )),
        };
        self.forget_pod(&uid);
        result
    }

    /// Lays out the container's root and volumes on the host.
    fn lay_out(&self, context: &ContainerContext) -> Result<Layout, String> {
        let name = context.container["name"].as_str().unwrap_or("container");
        let pod = self.pod_dir(&context.pod_uid);
        let root = pod.join("containers").join(name).join("root");
        let fail = |what: &str, e: std::io::Error| format!("cannot {what}: {e}");
        std::fs::create_dir_all(&root).map_err(|e| fail("make the container's root", e))?;
        // The root is the container's writable layer: the image's user (the sim's stand-in
        // for an image's root) may write in it, as a container's root may in a real one
        // (`kubectl cp` into `/`). Where the sim may not change owners, it stays the sim's.
        let owner = user(context);
        if owner.uid == IMAGE_USER {
            let _ = std::os::unix::fs::chown(&root, Some(owner.uid), Some(owner.gid));
        }
        let image_files: &[(PathBuf, PathBuf)] = self
            .image(context)
            .map(|i| i.files.as_slice())
            .unwrap_or_default();
        let targets: Vec<PathBuf> = context
            .mounts
            .iter()
            .filter_map(|m| inside(&m.path))
            .chain(image_files.iter().map(|(path, _)| path.clone()))
            .collect();
        let mut binds = vec![];
        for (dir, read_only) in SYSTEM {
            share(
                Path::new("/"),
                &root,
                Path::new(dir),
                *read_only,
                &targets,
                &mut binds,
            )
            .map_err(|e| fail("share the host's system folders", e))?;
        }
        for (path, host) in image_files {
            let at = root.join(path);
            if let Some(parent) = at.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| fail("lay out the image's files", e))?;
            }
            if std::fs::symlink_metadata(&at).is_err() {
                std::fs::File::create(&at).map_err(|e| fail("lay out the image's files", e))?;
            }
            binds.push((host.clone(), path.clone(), true));
        }
        // A `/dev` of its own: the usual devices, and the termination message file.
        std::fs::create_dir_all(root.join("dev")).map_err(|e| fail("make /dev", e))?;
        for device in DEVICES {
            let host = Path::new("/dev").join(device);
            let Ok(meta) = std::fs::metadata(&host) else {
                continue;
            };
            let at = root.join("dev").join(device);
            let made = match meta.is_dir() {
                true => std::fs::create_dir_all(&at),
                false => std::fs::File::create(&at).map(drop),
            };
            made.map_err(|e| fail("make /dev", e))?;
            binds.push((host, Path::new("dev").join(device), false));
        }
        for (link, target) in DEVICE_LINKS {
            let at = root.join("dev").join(link);
            if std::fs::symlink_metadata(&at).is_err() {
                std::os::unix::fs::symlink(target, &at).map_err(|e| fail("make /dev", e))?;
            }
        }
        let message = self.termination_file(&context.pod_uid, name);
        std::fs::write(&message, b"").map_err(|e| fail("make the termination message file", e))?;
        let _ = std::fs::set_permissions(&message, std::fs::Permissions::from_mode(0o666));
        let message_path = context.container["terminationMessagePath"]
            .as_str()
            .unwrap_or(TERMINATION_LOG);
        if let Some(target) = inside(message_path).filter(|t| !under_system(t)) {
            let at = root.join(&target);
            if let Some(parent) = at.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| fail("make the termination message file", e))?;
            }
            std::fs::File::create(&at).map_err(|e| fail("make the termination message file", e))?;
            binds.push((message, target, false));
        }
        for dir in ["tmp", "root", "home", "var/tmp"] {
            let at = root.join(dir);
            std::fs::create_dir_all(&at).map_err(|e| fail("make the container's folders", e))?;
        }
        for dir in ["tmp", "var/tmp"] {
            let _ =
                std::fs::set_permissions(root.join(dir), std::fs::Permissions::from_mode(0o1777));
        }
        let user = Some(user(context));
        for mount in &context.mounts {
            binds.push(self.mount(context, &pod, &root, mount, user)?);
        }
        let workdir = context.container["workingDir"]
            .as_str()
            .unwrap_or("/")
            .to_owned();
        let relative = inside(&workdir)
            .ok_or_else(|| format!("working directory {workdir} leaves the root"))?;
        if !under_system(&relative) {
            std::fs::create_dir_all(root.join(&relative))
                .map_err(|e| fail("make the working directory", e))?;
        }

        let mut env = context.env.clone();
        let mut default = |name: &str, value: String| {
            if !env.iter().any(|(n, _)| n == name) {
                env.insert(0, (name.to_owned(), value));
            }
        };
        default("PATH", DEFAULT_PATH.to_owned());
        default("HOSTNAME", context.pod_name.clone());
        default(
            "HOME",
            match user {
                Some(User { uid, .. }) if uid != 0 => "/".to_owned(),
                _ => "/root".to_owned(),
            },
        );
        Ok(Layout {
            root,
            binds,
            workdir,
            env,
            user,
        })
    }

    /// Prepares one volume mount: its source on the host and its mount point in the root.
    fn mount(
        &self,
        context: &ContainerContext,
        pod: &Path,
        root: &Path,
        mount: &VolumeMount,
        user: Option<User>,
    ) -> Result<(PathBuf, PathBuf, bool), String> {
        let fail = |e: std::io::Error| format!("cannot mount {}: {e}", mount.path);
        let source = match &mount.source {
            VolumeSource::Claim { uid, capacity } => {
                let dir = self.claim_dir(uid);
                if let Some(capacity) = capacity {
                    self.bound_claim(uid, &dir, *capacity).map_err(fail)?;
                }
                dir
            }
            VolumeSource::EmptyDir { volume } => pod.join("volumes").join(volume),
            VolumeSource::Files { volume, files } => {
                let name = context.container["name"].as_str().unwrap_or("container");
                let dir = pod.join("files").join(name).join(volume);
                remove_tree(&dir);
                for (path, bytes) in files {
                    let Some(relative) = inside(path) else {
                        continue;
                    };
                    let file = dir.join(relative);
                    if let Some(parent) = file.parent() {
                        std::fs::create_dir_all(parent).map_err(fail)?;
                    }
                    std::fs::write(&file, bytes).map_err(fail)?;
                    let _ = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644));
                }
                std::fs::create_dir_all(&dir).map_err(fail)?;
                dir
            }
        };
        if !matches!(mount.source, VolumeSource::Files { .. }) && !source.exists() {
            // Writable by anyone, as a provisioner's and an emptyDir's folders are; with an
            // fsGroup, owned by that group, as the kubelet's ownership management leaves it.
            std::fs::create_dir_all(&source).map_err(fail)?;
            let _ = std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o777));
        }
        if let Some(group) = user.and_then(|u| u.fs_group) {
            let _ = std::os::unix::fs::chown(&source, None, Some(group));
        }
        let source = match &mount.sub_path {
            Some(sub) => {
                let relative =
                    inside(sub).ok_or_else(|| format!("subPath {sub} leaves the volume"))?;
                // A volume's files are its pods' to write: a link they left must not lead the
                // mount out of the volume (the kubelet's subPath checks, CVE-2017-1002101).
                let mut at = source.clone();
                for part in relative.components() {
                    at.push(part);
                    match std::fs::symlink_metadata(&at) {
                        Ok(meta) if meta.file_type().is_symlink() => {
                            return Err(format!(
                                "failed to prepare subPath for volumeMount of {}: subpath {sub} is a symbolic link, which may lead out of the volume",
                                mount.path
                            ));
                        }
                        Ok(_) => {}
                        Err(_) => std::fs::create_dir(&at).map_err(fail)?,
                    }
                }
                at
            }
            None => source,
        };
        let target = inside(&mount.path)
            .ok_or_else(|| format!("mount path {} leaves the root", mount.path))?;
        let at = root.join(&target);
        if source.is_dir() {
            std::fs::create_dir_all(&at).map_err(fail)?;
        } else {
            if let Some(parent) = at.parent() {
                std::fs::create_dir_all(parent).map_err(fail)?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&at)
                .map_err(fail)?;
        }
        let read_only = mount.read_only || matches!(mount.source, VolumeSource::Files { .. });
        Ok((source, target, read_only))
    }

    fn layout(&self, key: &(String, String)) -> Option<Arc<Layout>> {
        self.inner
            .layouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    fn spawn_in(
        &self,
        layout: &Layout,
        argv: &[String],
        stdin: Stdio,
        terminal: Option<&std::fs::File>,
    ) -> Result<tokio::process::Child, String> {
        let (program, arguments) = argv
            .split_first()
            .ok_or_else(|| "no command given".to_owned())?;
        let enter = Enter::new(layout, terminal.is_some()).map_err(|e| e.to_string())?;
        let mut command = tokio::process::Command::new(program);
        command
            .args(arguments)
            .env_clear()
            .envs(layout.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        // A terminal's process knows what it is, as a container runtime says (TERM=xterm),
        // unless the container's own environment says otherwise.
        if terminal.is_some() && !layout.env.iter().any(|(k, _)| k == "TERM") {
            command.env("TERM", "xterm");
        }
        match terminal {
            Some(terminal) => {
                let clone = || terminal.try_clone().map_err(|e| e.to_string());
                command
                    .stdin(Stdio::from(clone()?))
                    .stdout(Stdio::from(clone()?))
                    .stderr(Stdio::from(clone()?));
            }
            None => {
                command
                    .stdin(stdin)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
            }
        }
        // SAFETY: `enter` makes only system calls on values prepared before the fork.
        unsafe {
            command.pre_exec(move || enter.enter());
        }
        command.spawn().map_err(|e| start_error(program, &e))
    }

    /// Starts `argv` as the container's main process: its output is the container's log;
    /// stopping it signals its whole process group, and when it exits, what it left running
    /// is killed (nothing outlives its container).
    pub fn run(
        &self,
        context: ContainerContext,
        argv: Vec<String>,
    ) -> BoxFuture<Result<RunningContainer, String>> {
        let this = self.clone();
        Box::pin(async move {
            let key = key(&context);
            // A restarted container gets a new root, as a new container gets a new layer.
            remove_tree(&this.pod_dir(&key.0).join("containers").join(&key.1));
            let layout = Arc::new(this.lay_out(&context)?);
            this.inner
                .layouts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone(), layout.clone());
            if argv.is_empty() {
                // Its image's entrypoint is not on the host: it runs nothing, but can be
                // entered.
                return IdleRuntime.start(context).await;
            }
            let mut child = this.spawn_container(&context, &layout, &argv)?;
            let pid = child.id();
            if let Some(pid) = pid {
                this.inner
                    .groups
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone(), pid);
            }
            if let Some(limit) = context.container["resources"]["limits"]["memory"]
                .as_str()
                .and_then(crate::quantity::units)
            {
                tokio::spawn(watch_memory(this.clone(), key.clone(), pid, limit as u64));
            }
            let (exit_tx, exited) = oneshot::channel();
            let (stop, stop_rx) = oneshot::channel::<Duration>();
            let stdins = this.clone();
            tokio::spawn(async move {
                // However this task ends (the sim stopping drops it), the group goes with it.
                let _group = Group(pid);
                let status = tokio::select! {
                    status = child.wait() => status,
                    grace = stop_rx => {
                        let grace = grace.unwrap_or_default();
                        signal_group(pid, libc::SIGTERM);
                        match tokio::time::timeout(grace, child.wait()).await {
                            Ok(status) => status,
                            Err(_) => {
                                signal_group(pid, libc::SIGKILL);
                                child.wait().await
                            }
                        }
                    }
                };
                // Its stdin and terminal end with it.
                stdins
                    .inner
                    .stdins
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key);
                let mut groups = stdins
                    .inner
                    .groups
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if groups.get(&key) == pid.as_ref() {
                    groups.remove(&key);
                }
                drop(groups);
                let _ = exit_tx.send(exit_code(status));
            });
            Ok(RunningContainer { exited, stop })
        })
    }

    /// Starts a container's main process: its output to the log, its stdin a pipe or a
    /// terminal when the spec asks (`stdin`, `tty`), kept for attaching.
    fn spawn_container(
        &self,
        context: &ContainerContext,
        layout: &Layout,
        argv: &[String],
    ) -> Result<tokio::process::Child, String> {
        use std::os::fd::AsRawFd;
        let wants_stdin = context.container["stdin"] == true;
        let once = context.container["stdinOnce"] == true;
        let key = key(context);
        let stdins = |file: Option<std::fs::File>, terminal| {
            self.inner
                .stdins
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    key.clone(),
                    ContainerStdin {
                        file,
                        terminal,
                        once,
                    },
                );
        };
        if context.container["tty"] == true {
            let terminal = open_terminal().map_err(|e| e.to_string())?;
            let child = self.spawn_in(layout, argv, Stdio::null(), Some(&terminal.terminal))?;
            drop(terminal.terminal);
            set_size(terminal.controller.as_raw_fd(), 80, 24);
            let controller = Arc::new(terminal.controller);
            let reader = controller.try_clone().map_err(|e| e.to_string())?;
            log_output(
                Some(TerminalReader(tokio::fs::File::from_std(reader))),
                context.log.clone(),
            );
            let writer = match wants_stdin {
                true => Some(controller.try_clone().map_err(|e| e.to_string())?),
                false => None,
            };
            stdins(writer, Some(controller));
            return Ok(child);
        }
        let stdin = if wants_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        let mut child = self.spawn_in(layout, argv, stdin, None)?;
        log_output(child.stdout.take(), context.log.clone());
        log_output(child.stderr.take(), context.log.clone());
        if let Some(input) = child.stdin.take() {
            let fd = input.into_owned_fd().map_err(|e| e.to_string())?;
            stdins(Some(std::fs::File::from(fd)), None);
        }
        Ok(child)
    }
}

/// Shares the host's `relative` (under `host_root`) into the container's `root`: bound whole
/// when no volume is mounted below it; else made in the root, with each of its entries shared
/// the same way (so a volume can be mounted at `/etc/app` or `/opt/tool` while the rest of the
/// host's `/etc` shows through). An entry a volume is mounted at is left to the volume.
fn share(
    host_root: &Path,
    root: &Path,
    relative: &Path,
    read_only: bool,
    targets: &[PathBuf],
    binds: &mut Vec<(PathBuf, PathBuf, bool)>,
) -> std::io::Result<()> {
    let host = host_root.join(relative);
    let Ok(meta) = std::fs::symlink_metadata(&host) else {
        return Ok(());
    };
    let at = root.join(relative);
    if targets.iter().any(|t| t == relative) {
        return Ok(());
    }
    if meta.file_type().is_symlink() {
        // A merged /usr: /bin is a link into it.
        if std::fs::symlink_metadata(&at).is_err() {
            std::os::unix::fs::symlink(std::fs::read_link(&host)?, &at)?;
        }
        return Ok(());
    }
    let below = targets.iter().any(|t| t.starts_with(relative));
    if meta.is_dir() {
        std::fs::create_dir_all(&at)?;
        if !below {
            binds.push((host, relative.to_owned(), read_only));
            return Ok(());
        }
        for entry in std::fs::read_dir(&host)?.flatten() {
            share(
                host_root,
                root,
                &relative.join(entry.file_name()),
                read_only,
                targets,
                binds,
            )?;
        }
    } else if meta.is_file() {
        if std::fs::symlink_metadata(&at).is_err() {
            std::fs::File::create(&at)?;
        }
        binds.push((host, relative.to_owned(), read_only));
    }
    Ok(())
}

/// The resident memory of the processes of group `pgid`, in bytes, from `/proc`.
fn group_memory(pgid: u32) -> u64 {
    group_usage(pgid).memory_bytes
}

/// What the processes of group `pgid` use, from `/proc`: resident memory, CPU time (user
/// and system), how many there are.
fn group_usage(pgid: u32) -> crate::runtime::Usage {
    let page = 4096;
    // SAFETY: sysconf has no preconditions.
    let ticks = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    let mut usage = crate::runtime::Usage::default();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command's name in parentheses: state, ppid, pgrp, ... utime (12th),
        // stime (13th).
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2).and_then(|g| g.parse::<u32>().ok()) != Some(pgid) {
            continue;
        }
        let time = |i: usize| {
            fields
                .get(i)
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(0)
        };
        usage.cpu_nanoseconds += (time(11) + time(12)) * 1_000_000_000 / ticks;
        usage.processes += 1;
        let resident = std::fs::read_to_string(entry.path().join("statm"))
            .ok()
            .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0);
        usage.memory_bytes += resident * page;
    }
    usage
}

/// The kernel's OOM killer for one container: its processes together over `limit` bytes are
/// killed, and the container ends `OOMKilled` (137).
async fn watch_memory(
    runtime: ProcessRuntime,
    key: (String, String),
    pid: Option<u32>,
    limit: u64,
) {
    let Some(pgid) = pid else { return };
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let used = tokio::task::spawn_blocking(move || group_memory(pgid))
            .await
            .unwrap_or_default();
        if used == 0 {
            return;
        }
        if used > limit {
            runtime
                .inner
                .oom_killed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key);
            signal_group(pid, libc::SIGKILL);
            return;
        }
    }
}

/// Whether a path in the container lies in a folder shared with the host.
fn under_system(relative: &Path) -> bool {
    relative
        .components()
        .next()
        .is_some_and(|first| SYSTEM.iter().any(|(dir, _)| first.as_os_str() == *dir))
}

/// A container of no pod, for the isolation check.
fn probe_context() -> ContainerContext {
    let uid = format!("isolation-check-{}", std::process::id());
    ContainerContext {
        namespace: "default".into(),
        pod_name: "isolation-check".into(),
        pod_uid: uid,
        pod: Value::Null,
        container: serde_json::json!({"name": "check"}),
        init: false,
        pod_ip: std::net::Ipv4Addr::LOCALHOST,
        token: String::new(),
        api_server: String::new(),
        ca_pem: String::new(),
        files: Default::default(),
        mounts: vec![],
        log: Default::default(),
        env: vec![],
    }
}

impl ContainerRuntime for ProcessRuntime {
    fn usage(&self, pod_uid: &str, container: &str) -> Option<crate::runtime::Usage> {
        let pgid = *self
            .inner
            .groups
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(pod_uid.to_owned(), container.to_owned()))?;
        Some(group_usage(pgid))
    }

    fn start(&self, context: ContainerContext) -> BoxFuture<Result<RunningContainer, String>> {
        let argv = self.command_line(&context);
        if argv.is_empty() && context.init {
            return IdleRuntime.start(context);
        }
        self.run(context, argv)
    }

    fn exec(
        &self,
        context: &ContainerContext,
        request: ExecRequest,
    ) -> BoxFuture<Result<ExecSession, String>> {
        let this = self.clone();
        let key = key(context);
        Box::pin(async move {
            let layout = this
                .layout(&key)
                .ok_or_else(|| format!("container not found (\"{}\")", key.1))?;
            let exec_error = |e: String| {
                format!(
                    "OCI runtime exec failed: exec failed: unable to start container process: {e}"
                )
            };
            let (exit_tx, exited) = oneshot::channel();
            if request.tty {
                let terminal = open_terminal().map_err(|e| e.to_string())?;
                // The size is the terminal's before the command starts (it may ask at once).
                {
                    use std::os::fd::AsRawFd;
                    let (columns, rows) = request.size.unwrap_or((80, 24));
                    set_size(terminal.controller.as_raw_fd(), columns, rows);
                }
                let mut child = this
                    .spawn_in(
                        &layout,
                        &request.command,
                        Stdio::null(),
                        Some(&terminal.terminal),
                    )
                    .map_err(exec_error)?;
                let hang_up = hang_up(&child);
                drop(terminal.terminal);
                use std::os::fd::AsRawFd;
                let writer = terminal.controller.try_clone().map_err(|e| e.to_string())?;
                let controller = Arc::new(terminal.controller);
                let keep = controller.clone();
                tokio::spawn(async move {
                    let _ = exit_tx.send(exit_code(child.wait().await));
                });
                let reader =
                    tokio::fs::File::from_std(keep.try_clone().map_err(|e| e.to_string())?);
                return Ok(ExecSession {
                    stdin: request
                        .stdin
                        .then(|| Box::pin(tokio::fs::File::from_std(writer)) as Writer),
                    stdout: Some(Box::pin(TerminalReader(reader)) as Reader),
                    stderr: None,
                    resize: Some(Box::new(move |columns, rows| {
                        set_size(controller.as_raw_fd(), columns, rows)
                    })),
                    exited,
                    hang_up,
                });
            }
            let stdin = if request.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            };
            let mut child = this
                .spawn_in(&layout, &request.command, stdin, None)
                .map_err(exec_error)?;
            let session = ExecSession {
                stdin: child.stdin.take().map(|s| Box::pin(s) as Writer),
                stdout: child.stdout.take().map(|s| Box::pin(s) as Reader),
                stderr: child.stderr.take().map(|s| Box::pin(s) as Reader),
                resize: None,
                exited,
                hang_up: hang_up(&child),
            };
            tokio::spawn(async move {
                let _ = exit_tx.send(exit_code(child.wait().await));
            });
            Ok(session)
        })
    }

    fn attach(&self, context: &ContainerContext) -> Option<AttachedInput> {
        let mut stdins = self.inner.stdins.lock().unwrap_or_else(|p| p.into_inner());
        let stdin = stdins.get_mut(&key(context))?;
        let file = match stdin.once {
            true => stdin.file.take(),
            false => stdin.file.as_ref().and_then(|f| f.try_clone().ok()),
        };
        let resize = stdin.terminal.clone().map(|terminal| {
            Box::new(move |columns, rows| {
                use std::os::fd::AsRawFd;
                set_size(terminal.as_raw_fd(), columns, rows)
            }) as Box<dyn Fn(u16, u16) + Send + Sync>
        });
        Some(AttachedInput {
            stdin: file.map(|f| Box::pin(tokio::fs::File::from_std(f)) as Writer),
            resize,
        })
    }

    fn exit_reason(&self, context: &ContainerContext) -> Option<String> {
        self.inner
            .oom_killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key(context))
            .then(|| "OOMKilled".to_owned())
    }

    fn termination_message(&self, context: &ContainerContext) -> Option<Vec<u8>> {
        let name = context.container["name"].as_str()?;
        let mut bytes = std::fs::read(self.termination_file(&context.pod_uid, name)).ok()?;
        bytes.truncate(TERMINATION_MESSAGE_LIMIT);
        Some(bytes)
    }

    fn forget_pod(&self, pod_uid: &str) {
        self.inner
            .layouts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(uid, _), _| uid != pod_uid);
        self.inner
            .stdins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(uid, _), _| uid != pod_uid);
        remove_tree(&self.pod_dir(pod_uid));
    }

    fn forget_claim(&self, claim_uid: &str) {
        let dir = self.claim_dir(claim_uid);
        if self.lock_bounded().remove(claim_uid).is_some() {
            unmount(&dir);
        }
        remove_tree(&dir);
    }
}

/// A terminal's output: once the last process holding the terminal is gone, reading it fails
/// (EIO), which is its end.
/// SIGHUP to an exec'd command's process group (it leads a session of its own).
fn hang_up(child: &tokio::process::Child) -> Option<Box<dyn FnOnce() + Send>> {
    let pid = i32::try_from(child.id()?).ok()?;
    Some(Box::new(move || {
        // SAFETY: kill with a process group and a signal number; no memory is involved.
        unsafe { libc::kill(-pid, libc::SIGHUP) };
    }))
}

struct TerminalReader(tokio::fs::File);

impl tokio::io::AsyncRead for TerminalReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match std::pin::Pin::new(&mut self.0).poll_read(cx, buf) {
            std::task::Poll::Ready(Err(e)) if e.raw_os_error() == Some(libc::EIO) => {
                std::task::Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_in_the_container_never_leaves_its_root() {
        assert_eq!(inside("/home/dev"), Some(PathBuf::from("home/dev")));
        assert_eq!(inside("data/./x"), Some(PathBuf::from("data/x")));
        assert_eq!(inside("/home/../etc"), None);
        assert!(under_system(Path::new("etc/app")));
        assert!(!under_system(Path::new("home/dev")));
        assert!(!under_system(Path::new("etcetera")));
    }

    #[test]
    fn a_container_runs_as_its_context_says_the_container_over_the_pod() {
        let context = |pod: Value, container: Value| ContainerContext {
            pod: serde_json::json!({"spec": {"securityContext": pod}}),
            container: serde_json::json!({"name": "c", "securityContext": container}),
            ..probe_context()
        };
        assert_eq!(
            user(&context(serde_json::json!({}), serde_json::json!({}))),
            User {
                uid: IMAGE_USER,
                gid: IMAGE_USER,
                fs_group: None,
                binds_low_ports: true,
            },
            "the image's user, never the sim's"
        );
        assert_eq!(
            user(&context(
                serde_json::json!({"runAsUser": 1000, "runAsGroup": 100, "fsGroup": 2000}),
                serde_json::json!({"runAsUser": 1001})
            )),
            User {
                uid: 1001,
                gid: 100,
                fs_group: Some(2000),
                binds_low_ports: false,
            }
        );
        let dropped = user(&context(
            serde_json::json!({}),
            serde_json::json!({"capabilities": {"drop": ["ALL"]}}),
        ));
        assert!(!dropped.binds_low_ports, "dropped with ALL");
    }

    #[test]
    fn removing_a_folder_never_crosses_into_another_file_system() {
        let dir = std::env::temp_dir().join(format!("berth-remove-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/file"), "x").unwrap();
        std::fs::set_permissions(dir.join("a"), std::fs::Permissions::from_mode(0o500)).unwrap();
        remove_tree(&dir);
        assert!(!dir.exists());
    }
}
