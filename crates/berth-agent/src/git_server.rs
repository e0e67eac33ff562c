//! A real git server on loopback for tests and `berth dev`: git's own smart HTTP server
//! (`git http-backend`, run as CGI for each request) behind an axum front that can ask for
//! basic authentication, hold pack downloads until the test lets them go (a clone caught in
//! the middle), and go down and come back on the same port. Nothing from the network.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::Response,
};
use base64::Engine;
use futures::StreamExt;
use tokio::{io::AsyncWriteExt, sync::watch};

/// What the server asks and does.
struct Inner {
    root: PathBuf,
    /// `username:password` a client must send, if any.
    credentials: Option<String>,
    /// While true, pack downloads (`POST .../git-upload-pack`) wait.
    held: watch::Sender<bool>,
    /// Pack downloads that arrived (held or not).
    packs: AtomicUsize,
    /// Requests refused for their credentials.
    refused: AtomicUsize,
    /// Milliseconds between 4 KiB pieces of a pack (0: all at once), so a clone's progress
    /// can be watched.
    trickle: AtomicUsize,
}

/// A git server over HTTP on a loopback port, serving the repositories under its root.
#[derive(Clone)]
pub struct GitServer {
    inner: Arc<Inner>,
    address: SocketAddr,
    serving: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl GitServer {
    /// Serves the bare repositories under `root` (`<root>/<name>.git`) on a free loopback port.
    pub async fn start(root: &Path, credentials: Option<(&str, &str)>) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let server = GitServer {
            inner: Arc::new(Inner {
                root: root.to_owned(),
                credentials: credentials.map(|(u, p)| format!("{u}:{p}")),
                held: watch::channel(false).0,
                packs: AtomicUsize::new(0),
                refused: AtomicUsize::new(0),
                trickle: AtomicUsize::new(0),
            }),
            address,
            serving: Arc::new(Mutex::new(None)),
        };
        server.serve(listener);
        Ok(server)
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(self.inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        *self.serving.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    /// `http://127.0.0.1:<port>/<name>.git`
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/{name}.git", self.address)
    }

    /// Stops listening: a clone meets a refused connection.
    pub fn down(&self) {
        if let Some(task) = self
            .serving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
    }

    /// Listens again on the same port.
    pub async fn up(&self) -> std::io::Result<()> {
        let listener = tokio::net::TcpListener::bind(self.address).await?;
        self.serve(listener);
        Ok(())
    }

    /// Holds pack downloads (true) or lets them go (false).
    pub fn hold(&self, held: bool) {
        self.inner.held.send_replace(held);
    }

    /// Sends packs in 4 KiB pieces `every` apart (zero: at once).
    pub fn trickle(&self, every: std::time::Duration) {
        let millis = usize::try_from(every.as_millis()).unwrap_or(usize::MAX);
        self.inner.trickle.store(millis, Ordering::SeqCst);
    }

    /// How many pack downloads arrived so far.
    pub fn packs(&self) -> usize {
        self.inner.packs.load(Ordering::SeqCst)
    }

    /// How many requests were refused for their credentials.
    pub fn refused(&self) -> usize {
        self.inner.refused.load(Ordering::SeqCst)
    }
}

/// Creates the bare repository `<root>/<name>.git` from a work tree with `files`, on branch
/// `main`; returns the commit. Later commits: [`commit`].
pub fn create_repository(
    root: &Path,
    name: &str,
    files: &[(&str, &str)],
) -> Result<String, String> {
    let work = root.join(format!("{name}.work"));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    git(&work, &["init", "-q", "-b", "main"])?;
    let commit = commit(root, name, files, "first")?;
    git(
        root,
        &[
            "clone",
            "-q",
            "--bare",
            &work.to_string_lossy(),
            &format!("{name}.git"),
        ],
    )?;
    // Protocol v2 lets a client ask for any commit the server has.
    git(
        &root.join(format!("{name}.git")),
        &["config", "uploadpack.allowAnySHA1InWant", "true"],
    )?;
    Ok(commit)
}

/// Commits `files` in the work tree of `name` (and pushes it to the bare repository once it
/// exists); returns the commit.
pub fn commit(
    root: &Path,
    name: &str,
    files: &[(&str, &str)],
    message: &str,
) -> Result<String, String> {
    let work = root.join(format!("{name}.work"));
    for (path, text) in files {
        let file = work.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(file, text).map_err(|e| e.to_string())?;
    }
    git(&work, &["add", "-A"])?;
    git(
        &work,
        &[
            "-c",
            "user.name=Berth Test",
            "-c",
            "user.email=test@berth.dev",
            "commit",
            "-q",
            "-m",
            message,
        ],
    )?;
    let bare = root.join(format!("{name}.git"));
    if bare.exists() {
        git(&work, &["push", "-q", &bare.to_string_lossy(), "main"])?;
    }
    git(&work, &["rev-parse", "HEAD"])
}

/// Runs git in `dir` without the machine's configuration; its output, trimmed.
pub fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .map_err(|e| format!("cannot run git (is it installed?): {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn plain(status: StatusCode, text: &str) -> Response {
    let mut response = Response::new(Body::from(text.to_owned()));
    *response.status_mut() = status;
    response
}

/// One request: authenticated, held if it downloads a pack, then answered by
/// `git http-backend`.
async fn handle(State(inner): State<Arc<Inner>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if let Some(expected) = &inner.credentials {
        let given = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        if given.as_deref() != Some(expected.as_str()) {
            if given.is_some() {
                inner.refused.fetch_add(1, Ordering::SeqCst);
            }
            let mut response = plain(StatusCode::UNAUTHORIZED, "authentication required\n");
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"git\""),
            );
            return response;
        }
    }
    let path = parts.uri.path().to_owned();
    if parts.method == axum::http::Method::POST && path.ends_with("/git-upload-pack") {
        inner.packs.fetch_add(1, Ordering::SeqCst);
        let mut held = inner.held.subscribe();
        let _ = held.wait_for(|h| !*h).await;
    }
    let body = match axum::body::to_bytes(body, 64 << 20).await {
        Ok(body) => body,
        Err(e) => return plain(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let pack = parts.method == axum::http::Method::POST && path.ends_with("/git-upload-pack");
    let query = parts.uri.query();
    let response = match cgi(
        &inner.root,
        &parts.method,
        &path,
        query,
        &parts.headers,
        body,
    )
    .await
    {
        Ok(response) => response,
        Err(e) => return plain(StatusCode::INTERNAL_SERVER_ERROR, &e),
    };
    let every = inner.trickle.load(Ordering::SeqCst);
    if !pack || every == 0 {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot read the pack");
    };
    let pieces: Vec<Bytes> = bytes.chunks(4096).map(Bytes::copy_from_slice).collect();
    let stream = futures::stream::iter(pieces).then(move |piece| async move {
        tokio::time::sleep(std::time::Duration::from_millis(every as u64)).await;
        Ok::<_, std::io::Error>(piece)
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Runs `git http-backend` for one request (CGI: the request in variables and stdin, the
/// response's headers and body on stdout).
async fn cgi(
    root: &Path,
    method: &axum::http::Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, String> {
    let header = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut child = tokio::process::Command::new("git")
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", method.as_str())
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query.unwrap_or_default())
        .env("CONTENT_TYPE", header(header::CONTENT_TYPE))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", header(header::CONTENT_ENCODING))
        .env(
            "GIT_PROTOCOL",
            headers
                .get("git-protocol")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default(),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run git http-backend: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| format!("git http-backend failed: {e}"))?;
    let _ = writer.await;
    let out = output.stdout;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)))
        .ok_or_else(|| {
            format!(
                "git http-backend answered no headers: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
    let (head, rest) = out.split_at(split.0);
    let mut response = Response::new(Body::from(rest[split.1..].to_vec()));
    for line in String::from_utf8_lossy(head).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("Status") {
            let code = value.split(' ').next().unwrap_or("200");
            *response.status_mut() = code
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::OK);
        } else if let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    Ok(response)
}
