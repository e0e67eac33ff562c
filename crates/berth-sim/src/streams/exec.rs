//! exec and attach, whichever protocol carries them: the client's input to the process, its
//! output back, and the error channel's last word.

use std::sync::Arc;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::mpsc,
};

use super::{ERROR, Input, Output, STDERR, STDOUT, Session};
use crate::{
    runtime::{AttachedInput, ContainerLog, Reader},
    sim::Sim,
};

/// Copies a process's output onto `channel` until it ends.
pub(super) fn pump(
    output: Option<Reader>,
    channel: u8,
    outputs: Output,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Some(mut output) = output else { return };
        let mut chunk = vec![0u8; 32 * 1024];
        while let Ok(n) = output.read(&mut chunk).await {
            if n == 0 || outputs.send((channel, chunk[..n].to_vec())).await.is_err() {
                break;
            }
        }
    })
}

/// An exec: the client's stdin and resizes go to the process, its output comes back, and the
/// error channel ends it with the exit status.
pub(super) async fn exec(
    mut inputs: mpsc::Receiver<Input>,
    outputs: Output,
    session: Session,
    command: Vec<String>,
    started: Result<crate::runtime::ExecSession, String>,
) {
    let process = match started {
        Ok(process) => process,
        Err(error) => {
            let message = format!(
                "error executing command in container: failed to exec in container: failed to start exec \"{}\": {error}",
                exec_id()
            );
            let _ = outputs
                .send((ERROR, session.status(Err(message), &command)))
                .await;
            return;
        }
    };
    let crate::runtime::ExecSession {
        stdin,
        stdout,
        stderr,
        resize,
        exited,
        // As the kubelet: a command outlives its exec's caller.
        hang_up: _,
    } = process;
    let options = session.options;
    let pumps = [
        pump(stdout.filter(|_| options.stdout), STDOUT, outputs.clone()),
        pump(stderr.filter(|_| options.stderr), STDERR, outputs.clone()),
    ];
    let reader = tokio::spawn(async move {
        let mut stdin = stdin.filter(|_| options.stdin);
        while let Some(input) = inputs.recv().await {
            match input {
                Input::Stdin(data) => {
                    if let Some(writer) = stdin.as_mut()
                        && (writer.write_all(&data).await.is_err() || writer.flush().await.is_err())
                    {
                        stdin = None;
                    }
                }
                Input::Resize { width, height } => {
                    if let Some(resize) = &resize {
                        resize(width, height);
                    }
                }
                Input::StdinEnd => {
                    if let Some(mut writer) = stdin.take() {
                        let _ = writer.shutdown().await;
                    }
                }
            }
        }
    });
    let code = exited.await.unwrap_or(128 + libc::SIGKILL);
    for pump in pumps {
        let _ = pump.await;
    }
    reader.abort();
    let _ = outputs
        .send((ERROR, session.status(Ok(code), &command)))
        .await;
}

/// An exec's ID as containerd names one.
pub(super) fn exec_id() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An attach: the container's output from now on, until it exits or the client goes; the
/// client's input to the container's own stdin and terminal, when it has them.
pub(super) async fn attach(
    mut inputs: mpsc::Receiver<Input>,
    outputs: Output,
    session: Session,
    ((uid, container), log, input): (
        (String, String),
        Option<ContainerLog>,
        Option<AttachedInput>,
    ),
    sim: Arc<Sim>,
) {
    let Some(log) = log else {
        let message = format!("container not found (\"{container}\")");
        let _ = outputs
            .send((ERROR, session.status(Err(message), &[])))
            .await;
        return;
    };
    let (mut stdin, resize) = match input {
        Some(AttachedInput { stdin, resize }) => (stdin, resize),
        None => (None, None),
    };
    let channel = if session.options.stdout || session.options.tty {
        STDOUT
    } else {
        STDERR
    };
    let (_, mut read) = log.read();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(50));
    loop {
        tokio::select! {
            input = inputs.recv() => match input {
                None => return,
                Some(Input::Stdin(data)) => {
                    if let Some(writer) = stdin.as_mut()
                        && (writer.write_all(&data).await.is_err()
                            || writer.flush().await.is_err())
                    {
                        stdin = None;
                    }
                    continue;
                }
                Some(Input::StdinEnd) => {
                    if let Some(mut writer) = stdin.take() {
                        let _ = writer.shutdown().await;
                    }
                    continue;
                }
                Some(Input::Resize { width, height }) => {
                    if let Some(resize) = &resize {
                        resize(width, height);
                    }
                    continue;
                }
            },
            _ = tick.tick() => {}
        }
        let (new, written) = log.since(read);
        read = written;
        if !new.is_empty() && outputs.send((channel, new)).await.is_err() {
            return;
        }
        let running = sim
            .containers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(uid.clone(), container.clone()))
            .is_some_and(|c| c.log.same(&log));
        if !running {
            let _ = outputs.send((ERROR, session.status(Ok(0), &[]))).await;
            return;
        }
    }
}
