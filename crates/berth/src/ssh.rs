//! `berth ssh NAME [-- COMMAND...]` and `berth ssh-config NAME...`: SSH into a workspace through
//! the gateway with the user's bearer token, for plain OpenSSH and what runs on it (`scp`,
//! `sftp`, `rsync`, `ssh -L`, VS Code Remote-SSH, JetBrains Gateway). `berth ssh --stdio` is
//! the connection itself on stdin and stdout (OpenSSH's `ProxyCommand`); `ssh-config` prints
//! `Host berth--NAME` entries that use it and writes the workspaces' host keys where the
//! entries say, so the first connection is verified like every later one.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use berth_gateway::ssh::Said;
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::workspaces::{Target, bearer_token, discover_gateway, load, own_websocket, tunnel};

/// Options of `berth ssh`.
#[derive(clap::Args, Debug)]
pub struct SshArgs {
    #[command(flatten)]
    pub target: Target,
    /// The workspace.
    pub name: String,
    /// The command to run, after `--` (default: a login shell on a terminal).
    #[arg(last = true)]
    pub command: Vec<String>,
    /// The gateway's address (as for `berth open`).
    #[arg(long, env = "BERTH_GATEWAY")]
    pub gateway: Option<String>,
    /// Be the connection itself on stdin and stdout, for OpenSSH's ProxyCommand (what
    /// `berth ssh-config` writes).
    #[arg(long)]
    pub stdio: bool,
    /// The OpenSSH client to run.
    #[arg(long, env = "BERTH_SSH", default_value = "ssh")]
    pub ssh: String,
}

/// Options of `berth ssh-config`.
#[derive(clap::Args, Debug)]
pub struct SshConfigArgs {
    #[command(flatten)]
    pub target: Target,
    /// The workspaces.
    #[arg(required = true)]
    pub names: Vec<String>,
    /// The gateway's address (as for `berth open`).
    #[arg(long, env = "BERTH_GATEWAY")]
    pub gateway: Option<String>,
    /// Where the workspaces' host keys are written (an OpenSSH known_hosts file that the
    /// entries name; lines of other hosts are kept). Default: ~/.ssh/berth_known_hosts.
    #[arg(long, env = "BERTH_KNOWN_HOSTS")]
    pub known_hosts: Option<PathBuf>,
}

/// The name OpenSSH knows a workspace by: `berth--NAME` (and `berth--NAME--NAMESPACE`, also
/// the name its host key is kept under).
pub fn host_alias(name: &str, namespace: &str) -> String {
    format!("berth--{name}--{namespace}")
}

/// `berth ssh`: the connection itself (`--stdio`), else OpenSSH run with it as its proxy and
/// the workspace's host key as the only one it accepts; its exit code is berth's.
pub async fn run(args: SshArgs) -> Result<i32, String> {
    let (config, namespace) = load(&args.target).await?;
    let gateway = discover_gateway(args.gateway.as_deref(), &args.target, &config).await?;
    let token = bearer_token(&config).await?;
    let url = own_websocket(&gateway, &namespace, &args.name, "ssh");
    let _ = rustls::crypto::ring::default_provider().install_default();
    if args.stdio {
        return stdio(&url, &token).await.map(|()| 0);
    }
    let key = host_key(&url, &token).await?;
    let alias = host_alias(&args.name, &namespace);
    let known = tempfile::Builder::new()
        .prefix("berth-known-hosts")
        .tempfile()
        .map_err(|e| format!("cannot write the host key: {e}"))?;
    std::fs::write(known.path(), format!("{alias} {key}\n"))
        .map_err(|e| format!("cannot write the host key: {e}"))?;
    let proxy = proxy_command(&args.target, &gateway, &namespace, &args.name)?;
    let mut ssh = tokio::process::Command::new(&args.ssh);
    for option in options(&proxy, &alias, known.path()) {
        ssh.arg("-o").arg(option);
    }
    ssh.arg(&alias).args(&args.command);
    let status = ssh
        .status()
        .await
        .map_err(|e| format!("cannot run {}: {e}", args.ssh))?;
    Ok(status.code().unwrap_or(255))
}

/// The OpenSSH options that reach a workspace through `proxy`, known as `alias`, whose host
/// key is in `known_hosts` and no other file.
fn options(proxy: &str, alias: &str, known_hosts: &Path) -> Vec<String> {
    vec![
        format!("ProxyCommand={proxy}"),
        format!("HostKeyAlias={alias}"),
        format!("UserKnownHostsFile={}", config_path(known_hosts)),
        "GlobalKnownHostsFile=/dev/null".to_owned(),
        "StrictHostKeyChecking=yes".to_owned(),
    ]
}

/// `berth ssh-config`: the workspaces' host keys written to the known-hosts file, and their
/// `Host` entries printed.
pub async fn config(args: SshConfigArgs) -> Result<(), String> {
    let (config, namespace) = load(&args.target).await?;
    let gateway = discover_gateway(args.gateway.as_deref(), &args.target, &config).await?;
    let token = bearer_token(&config).await?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let known_hosts = match args.known_hosts.clone() {
        Some(path) => path,
        None => std::env::home_dir()
            .ok_or("no home folder for ~/.ssh/berth_known_hosts: pass --known-hosts")?
            .join(".ssh")
            .join("berth_known_hosts"),
    };
    let known_hosts = std::path::absolute(&known_hosts).map_err(|e| e.to_string())?;
    let mut keys = vec![];
    for name in &args.names {
        let url = own_websocket(&gateway, &namespace, name, "ssh");
        let key = host_key(&url, &token)
            .await
            .map_err(|e| format!("workspace {namespace}/{name}: {e}"))?;
        keys.push((host_alias(name, &namespace), key));
    }
    let before = match std::fs::read_to_string(&known_hosts) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", known_hosts.display())),
    };
    write_private(&known_hosts, &known_hosts_with(&before, &keys))?;
    let mut out = String::new();
    for name in &args.names {
        let proxy = proxy_command(&args.target, &gateway, &namespace, name)?;
        out.push_str(&entry(
            name,
            &namespace,
            args.target.namespace.is_none(),
            &proxy,
            &known_hosts,
        ));
    }
    print!("{out}");
    eprintln!(
        "berth ssh-config: the host keys of {} are in {}; add these entries to ~/.ssh/config (or Include a file with them), then `ssh {}`",
        args.names
            .iter()
            .map(|n| format!("{namespace}/{n}"))
            .collect::<Vec<_>>()
            .join(", "),
        known_hosts.display(),
        host_alias(&args.names[0], &namespace)
    );
    Ok(())
}

/// One `Host` entry: `berth--NAME--NAMESPACE`, and `berth--NAME` too for the context's own
/// namespace.
fn entry(
    name: &str,
    namespace: &str,
    default_namespace: bool,
    proxy: &str,
    known_hosts: &Path,
) -> String {
    let alias = host_alias(name, namespace);
    let hosts = match default_namespace {
        true => format!("berth--{name} {alias}"),
        false => alias.clone(),
    };
    let mut entry = format!("Host {hosts}\n");
    for option in options(proxy, &alias, known_hosts) {
        let (key, value) = option.split_once('=').unwrap_or((&option, ""));
        entry.push_str(&format!("  {key} {value}\n"));
    }
    entry.push('\n');
    entry
}

/// `before` (a known_hosts file's text) with the lines for `keys`' hosts replaced by theirs.
pub fn known_hosts_with(before: &str, keys: &[(String, String)]) -> String {
    let mut text: String = before
        .lines()
        .filter(|line| {
            let host = line.split_whitespace().next().unwrap_or_default();
            !keys.iter().any(|(alias, _)| alias == host)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    for (alias, key) in keys {
        text.push_str(&format!("{alias} {key}\n"));
    }
    text
}

/// Writes `text` to `path` (its folder made) readable by its owner only, whole or not at all.
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let mut file = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)?;
    std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
    file.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

/// A path as ssh_config takes it: `%` (a token there) doubled, quoted when it has spaces.
fn config_path(path: &Path) -> String {
    let text = path.display().to_string().replace('%', "%%");
    match text.contains(char::is_whitespace) {
        true => format!("\"{text}\""),
        false => text,
    }
}

/// Quotes `word` for the shell OpenSSH runs a ProxyCommand with, and doubles `%`.
fn shell_word(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''").replace('%', "%%"))
}

/// The ProxyCommand that connects to workspace `namespace/name`: this binary's `ssh --stdio`
/// with the gateway, kubeconfig and context used now (an editor may start it with another
/// environment).
fn proxy_command(
    target: &Target,
    gateway: &str,
    namespace: &str,
    name: &str,
) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut words = vec![
        exe.display().to_string(),
        "ssh".to_owned(),
        "--stdio".to_owned(),
        "--gateway".to_owned(),
        gateway.to_owned(),
    ];
    let kubeconfig = target
        .kubeconfig
        .clone()
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from));
    if let Some(kubeconfig) = kubeconfig {
        let kubeconfig = match kubeconfig.to_str().is_some_and(|k| k.contains(':')) {
            // A list of files, as KUBECONFIG may be: kept as it is.
            true => kubeconfig,
            false => std::path::absolute(&kubeconfig).map_err(|e| e.to_string())?,
        };
        words.push("--kubeconfig".to_owned());
        words.push(kubeconfig.display().to_string());
    }
    if let Some(context) = &target.context {
        words.push("--context".to_owned());
        words.push(context.clone());
    }
    words.extend(["-n".to_owned(), namespace.to_owned(), name.to_owned()]);
    Ok(words
        .iter()
        .map(|w| shell_word(w))
        .collect::<Vec<_>>()
        .join(" "))
}

/// The workspace's SSH host key, as the gateway hands it over from its agent.
async fn host_key(url: &str, token: &str) -> Result<String, String> {
    let mut socket = tunnel(&format!("{url}?hostKey"), token).await?;
    let key = loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) => match serde_json::from_str::<Said>(&text) {
                Ok(Said::HostKey(key)) => break key,
                Ok(Said::Error(why)) => return Err(why),
                Err(_) => continue,
            },
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                return Err("the gateway closed the connection before the host key".to_owned());
            }
            Some(Ok(_)) => {}
        }
    };
    let _ = socket.close(None).await;
    Ok(key)
}

/// The SSH connection on stdin and stdout until either side ends; a refusal or the gateway's
/// reason for ending it, as the error.
async fn stdio(url: &str, token: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tunnel(url, token).await?;
    let (mut to_gateway, mut from_gateway) = socket.split();
    let typing = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = bytes::Bytes::copy_from_slice(&buffer[..n]);
                    if to_gateway.send(Message::Binary(chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = to_gateway.send(Message::Close(None)).await;
    });
    let mut stdout = tokio::io::stdout();
    let mut ended = Ok(());
    while let Some(message) = from_gateway.next().await {
        match message {
            Ok(Message::Binary(bytes)) => {
                if stdout.write_all(&bytes).await.is_err() || stdout.flush().await.is_err() {
                    break;
                }
            }
            Ok(Message::Text(text)) => {
                if let Ok(Said::Error(why)) = serde_json::from_str(&text) {
                    ended = Err(why);
                }
            }
            Ok(Message::Close(_)) => break,
            Ok(_) => {}
            Err(e) => {
                ended = Err(format!("the connection to the gateway failed: {e}"));
                break;
            }
        }
    }
    typing.abort();
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspaces_known_host_line_replaces_its_old_one_and_keeps_the_rest() {
        let before = "github.com ssh-ed25519 AAAAgh\nberth--web--default ssh-ed25519 OLD\n";
        let after = known_hosts_with(
            before,
            &[("berth--web--default".into(), "ssh-ed25519 NEW".into())],
        );
        assert_eq!(
            after,
            "github.com ssh-ed25519 AAAAgh\nberth--web--default ssh-ed25519 NEW\n"
        );
    }

    #[test]
    fn an_entry_names_the_workspace_and_trusts_only_its_key() {
        let entry = entry(
            "web",
            "default",
            true,
            "'/bin/berth' 'ssh' '--stdio' '-n' 'default' 'web'",
            Path::new("/home/me/.ssh/berth 100%"),
        );
        assert_eq!(
            entry,
            "Host berth--web berth--web--default\n  ProxyCommand '/bin/berth' 'ssh' '--stdio' '-n' 'default' 'web'\n  HostKeyAlias berth--web--default\n  UserKnownHostsFile \"/home/me/.ssh/berth 100%%\"\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n\n"
        );
    }

    #[test]
    fn proxy_command_words_survive_the_shell_and_ssh_tokens() {
        assert_eq!(shell_word("it's 5%"), r"'it'\''s 5%%'");
    }
}
