//! `berth serve`: a folder's files over HTTP, so a workspace has a real server on its port
//! with nothing in its image but Berth (`berth dev`'s `web` example).

use std::{net::SocketAddr, path::PathBuf};

/// Options of `berth serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Where to listen, e.g. 0.0.0.0:8080. In the simulated cluster pods share the machine's
    /// network, so a pod listens on its own IP: `$(POD_IP):8080` with POD_IP from the
    /// downward API.
    #[arg(long, default_value = "0.0.0.0:8080", env = "BERTH_SERVE_LISTEN")]
    pub listen: SocketAddr,
    /// The folder whose files are served; a folder's `index.html` answers for it.
    pub dir: PathBuf,
}

/// Serves `dir` until the process is stopped.
pub async fn run(args: ServeArgs) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    println!(
        "berth serve: serving {} on http://{}",
        args.dir.display(),
        args.listen
    );
    // Never kept by a browser: once the workspace stops, the same address must show the
    // gateway's page saying so (and offering to start it), not a copy of the app.
    let files = axum::Router::new()
        .fallback_service(tower_http::services::ServeDir::new(args.dir))
        .layer(axum::middleware::map_response(no_store));
    axum::serve(listener, files)
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
