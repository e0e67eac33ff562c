//! `berth serve`: a folder's files over HTTP, so a workspace has a real server on its port
//! with nothing in its image but Berth (`berth dev`'s `web` example); with `--edit`, a small
//! editor in the browser for the folder's files (`berth dev`'s `ide` kind), reached, like
//! every workspace port, only through the gateway.

use std::{
    net::SocketAddr,
    path::{Component, Path, PathBuf},
};

use axum::{
    extract::{Query, State},
    response::{IntoResponse, Response},
};
use http::StatusCode;

/// Options of `berth serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Where to listen, e.g. 0.0.0.0:8080. In the simulated cluster pods share the machine's
    /// network, so a pod listens on its own IP: `$(POD_IP):8080` with POD_IP from the
    /// downward API.
    #[arg(long, default_value = "0.0.0.0:8080", env = "BERTH_SERVE_LISTEN")]
    pub listen: SocketAddr,
    /// Serve an editor of the folder's files at `/` (list, open, save) instead of the files
    /// themselves. Anyone who reaches the port may change the files: reach it only through
    /// Berth's gateway (deploy/workspace-namespace-gateway-only/).
    #[arg(long, env = "BERTH_SERVE_EDIT")]
    pub edit: bool,
    /// The folder whose files are served; a folder's `index.html` answers for it.
    pub dir: PathBuf,
}

/// The largest file the editor opens or saves.
pub const MAX_EDIT_BYTES: usize = 1024 * 1024;

const EDITOR: &str = include_str!("editor.html");

/// Serves `dir` until the process is stopped.
pub async fn run(args: ServeArgs) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    println!(
        "berth serve: {} {} on http://{}",
        if args.edit { "editing" } else { "serving" },
        args.dir.display(),
        args.listen
    );
    let app = match args.edit {
        true => editor(args.dir),
        // Never kept by a browser: once the workspace stops, the same address must show the
        // gateway's page saying so (and offering to start it), not a copy of the app.
        false => {
            axum::Router::new().fallback_service(tower_http::services::ServeDir::new(args.dir))
        }
    }
    .layer(axum::middleware::map_response(no_store));
    axum::serve(listener, app)
        .await
        .map_err(|e| format!("serving stopped: {e}"))
}

async fn no_store(mut response: axum::response::Response) -> axum::response::Response {
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    response
}

/// The editor: its page at `/`, `GET api/list?path=`, `GET api/file?path=` and
/// `PUT api/file?path=` for the files under `root`.
pub fn editor(root: PathBuf) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route(
            "/",
            get(|| async {
                (
                    [(http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    EDITOR,
                )
            }),
        )
        .route("/api/list", get(list))
        .route("/api/file", get(read).put(write))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_EDIT_BYTES))
        .with_state(std::sync::Arc::new(root))
}

#[derive(serde::Deserialize)]
struct Asked {
    #[serde(default)]
    path: String,
}

/// `rel` under `root`, if it stays there: no absolute path, no `..`, and (for what exists) no
/// symbolic link that leads out.
pub fn inside(root: &Path, rel: &str) -> Result<PathBuf, String> {
    let rel = Path::new(rel.trim_start_matches('/'));
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!("{} is not a path inside the folder", rel.display()));
    }
    let path = root.join(rel);
    let real_root = root
        .canonicalize()
        .map_err(|e| format!("{}: {e}", root.display()))?;
    // The deepest part that exists must resolve inside the root.
    let mut existing = path.as_path();
    while !existing.exists() {
        existing = existing.parent().unwrap_or(root);
    }
    let real = existing.canonicalize().map_err(|e| e.to_string())?;
    match real.starts_with(&real_root) {
        true => Ok(path),
        false => Err(format!("{} leads out of the folder", rel.display())),
    }
}

fn refused(status: StatusCode, why: String) -> Response {
    (status, why).into_response()
}

async fn list(State(root): State<std::sync::Arc<PathBuf>>, Query(asked): Query<Asked>) -> Response {
    let dir = match inside(&root, &asked.path) {
        Ok(dir) => dir,
        Err(why) => return refused(StatusCode::FORBIDDEN, why),
    };
    let mut entries = match tokio::fs::read_dir(&dir).await {
        Ok(entries) => entries,
        Err(e) => return refused(StatusCode::NOT_FOUND, format!("{}: {e}", asked.path)),
    };
    let mut listed = vec![];
    while let Ok(Some(entry)) = entries.next_entry().await {
        let Ok(kind) = entry.file_type().await else {
            continue;
        };
        listed.push(serde_json::json!({
            "name": entry.file_name().to_string_lossy(),
            "dir": kind.is_dir(),
        }));
    }
    listed.sort_by(|a, b| {
        (!a["dir"].as_bool().unwrap_or(false), a["name"].as_str())
            .cmp(&(!b["dir"].as_bool().unwrap_or(false), b["name"].as_str()))
    });
    axum::Json(listed).into_response()
}

async fn read(State(root): State<std::sync::Arc<PathBuf>>, Query(asked): Query<Asked>) -> Response {
    let path = match inside(&root, &asked.path) {
        Ok(path) => path,
        Err(why) => return refused(StatusCode::FORBIDDEN, why),
    };
    match tokio::fs::read(&path).await {
        Ok(bytes) if bytes.len() > MAX_EDIT_BYTES => refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{} is larger than {MAX_EDIT_BYTES} bytes", asked.path),
        ),
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => text.into_response(),
            Err(_) => refused(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("{} is not text (UTF-8)", asked.path),
            ),
        },
        Err(e) => refused(StatusCode::NOT_FOUND, format!("{}: {e}", asked.path)),
    }
}

async fn write(
    State(root): State<std::sync::Arc<PathBuf>>,
    Query(asked): Query<Asked>,
    body: axum::body::Bytes,
) -> Response {
    let path = match inside(&root, &asked.path) {
        Ok(path) if !asked.path.trim_matches('/').is_empty() => path,
        Ok(_) => return refused(StatusCode::BAD_REQUEST, "which file?".to_owned()),
        Err(why) => return refused(StatusCode::FORBIDDEN, why),
    };
    if let Some(dir) = path.parent()
        && let Err(e) = tokio::fs::create_dir_all(dir).await
    {
        return refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}: {e}", dir.display()),
        );
    }
    match tokio::fs::write(&path, &body).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}: {e}", asked.path),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_editor_stays_inside_its_folder() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("src")).unwrap();
        std::os::unix::fs::symlink("/etc", root.path().join("out")).unwrap();
        assert!(inside(root.path(), "src/main.rs").is_ok());
        assert!(inside(root.path(), "new/dir/file.txt").is_ok());
        assert!(inside(root.path(), "").is_ok());
        for escape in ["../x", "src/../../x", "out/passwd", "out/new"] {
            assert!(inside(root.path(), escape).is_err(), "{escape}");
        }
        assert_eq!(
            inside(root.path(), "/etc/passwd").unwrap(),
            root.path().join("etc/passwd"),
            "a leading slash is the folder's root"
        );
    }
}
