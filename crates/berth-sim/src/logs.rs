//! `pods/log`, as the kubelet serves it: the current or the previous container's output, by
//! lines with the kubelet's timestamps, picked by `sinceSeconds`/`sinceTime` and `tailLines`,
//! cut at `limitBytes`, and followed while the container runs.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::Value;

use crate::{
    error::{ApiError, ApiResult},
    resources::ResourceType,
    runtime::{ContainerLog, LogLine},
    sim::Sim,
};

/// How a log is shown: which lines, how, how much.
#[derive(Clone, Debug, Default, PartialEq)]
struct Options {
    since: Option<jiff::Timestamp>,
    tail: Option<usize>,
    timestamps: bool,
    limit: Option<usize>,
    follow: bool,
    previous: bool,
}

fn number<T: std::str::FromStr>(
    query: &std::collections::HashMap<String, String>,
    name: &str,
) -> ApiResult<Option<T>> {
    query
        .get(name)
        .map(|v| {
            v.parse::<T>().map_err(|_| {
                ApiError::bad_request(format!("invalid value {v:?} for {name}: not a number"))
            })
        })
        .transpose()
}

impl Options {
    fn parse(query: &std::collections::HashMap<String, String>) -> ApiResult<Options> {
        let flag = |name: &str| matches!(query.get(name).map(String::as_str), Some("true" | "1"));
        let since_seconds: Option<i64> = number(query, "sinceSeconds")?;
        let since_time = query
            .get("sinceTime")
            .map(|t| {
                t.parse::<jiff::Timestamp>().map_err(|e| {
                    ApiError::bad_request(format!("invalid value {t:?} for sinceTime: {e}"))
                })
            })
            .transpose()?;
        if since_seconds.is_some() && since_time.is_some() {
            return Err(ApiError::bad_request(
                "at most one of `sinceTime` or `sinceSeconds` may be specified",
            ));
        }
        if since_seconds.is_some_and(|s| s < 1) {
            return Err(ApiError::bad_request(
                "sinceSeconds: Invalid value: must be greater than 0",
            ));
        }
        let limit: Option<i64> = number(query, "limitBytes")?;
        if limit.is_some_and(|l| l < 1) {
            return Err(ApiError::bad_request(
                "limitBytes: Invalid value: must be greater than 0",
            ));
        }
        let tail: Option<i64> = number(query, "tailLines")?;
        if tail.is_some_and(|t| t < 0) {
            return Err(ApiError::bad_request(
                "tailLines: Invalid value: must be greater than or equal to 0",
            ));
        }
        Ok(Options {
            since: since_time.or_else(|| {
                since_seconds.map(|s| jiff::Timestamp::now() - jiff::SignedDuration::from_secs(s))
            }),
            tail: tail.map(|t| t as usize),
            timestamps: flag("timestamps"),
            limit: limit.map(|l| l as usize),
            follow: flag("follow"),
            previous: flag("previous"),
        })
    }

    /// The lines shown of `lines`, rendered.
    fn render(&self, lines: Vec<LogLine>) -> Vec<u8> {
        let lines: Vec<LogLine> = lines
            .into_iter()
            .filter(|l| self.since.is_none_or(|since| l.at >= since))
            .collect();
        let skip = self.tail.map_or(0, |n| lines.len().saturating_sub(n));
        let mut out = vec![];
        for line in lines.into_iter().skip(skip) {
            if self.timestamps {
                out.extend(format!("{} ", line.at).into_bytes());
            }
            out.extend(line.bytes);
        }
        out
    }
}

/// Serves `GET pods/NAME/log`.
pub fn serve(
    sim: &Arc<Sim>,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    query: &std::collections::HashMap<String, String>,
) -> ApiResult<Response> {
    let options = Options::parse(query)?;
    let pod = sim.get(rt, namespace, name)?;
    let key = |container: &str| {
        (
            pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            container.to_owned(),
        )
    };
    let wanted = query.get("container").map(String::as_str);
    let (container, log) = if options.previous {
        let container = crate::pods::container_named(&pod, name, wanted)?;
        let log = sim
            .previous_logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key(&container))
            .cloned()
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "previous terminated container \"{container}\" in pod \"{name}\" not found"
                ))
            })?;
        (container, log)
    } else {
        let container = check_log_container(&pod, name, wanted)?;
        let log = sim
            .logs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key(&container))
            .cloned()
            .unwrap_or_default();
        (container, log)
    };
    let (lines, written) = log.lines_since(0);
    let mut shown = options.render(lines);
    let left = options.limit.map(|limit| limit.saturating_sub(shown.len()));
    if let Some(limit) = options.limit {
        shown.truncate(limit);
    }
    if !options.follow || options.previous || left == Some(0) {
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain")],
            shown,
        )
            .into_response());
    }
    // A follower gets what is there, then what the container writes while it runs; the
    // stream ends with it, as with a real kubelet.
    let rest = follow(
        sim.clone(),
        rt.storage.to_string(),
        namespace.to_owned(),
        pod,
        container,
        log,
        written,
        Options {
            since: None,
            tail: None,
            ..options
        },
        left,
    );
    let first =
        futures::stream::iter([Ok::<_, std::convert::Infallible>(bytes::Bytes::from(shown))]);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from_stream(futures::StreamExt::chain(first, rest)))
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// The rest of `log?follow=true`: what the container writes after `from`, while it runs, at
/// most `left` bytes.
#[allow(clippy::too_many_arguments)]
fn follow(
    sim: Arc<Sim>,
    storage: String,
    namespace: String,
    pod: Value,
    container: String,
    log: ContainerLog,
    from: u64,
    options: Options,
    left: Option<usize>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::convert::Infallible>> {
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let uid = pod["metadata"]["uid"].clone();
    futures::stream::unfold((from, left), move |(read, left)| {
        let (sim, storage, namespace, name, uid, container, log, options) = (
            sim.clone(),
            storage.clone(),
            namespace.clone(),
            name.clone(),
            uid.clone(),
            container.clone(),
            log.clone(),
            options.clone(),
        );
        async move {
            if left == Some(0) {
                return None;
            }
            loop {
                let (lines, written) = log.lines_since(read);
                if !lines.is_empty() {
                    let mut new = options.render(lines);
                    if let Some(left) = left {
                        new.truncate(left);
                    }
                    let left = left.map(|l| l - new.len());
                    return Some((Ok(bytes::Bytes::from(new)), (written, left)));
                }
                if !still_running(&sim, &storage, &namespace, &name, &uid, &container) {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    })
}

/// Whether `container` of the pod with `uid` still runs in the store.
fn still_running(
    sim: &Sim,
    storage: &str,
    namespace: &str,
    name: &str,
    uid: &Value,
    container: &str,
) -> bool {
    let Some(pod) = sim.store.get(storage, namespace, name) else {
        return false;
    };
    pod["metadata"]["uid"] == *uid
        && [
            "initContainerStatuses",
            "containerStatuses",
            "ephemeralContainerStatuses",
        ]
        .iter()
        .flat_map(|list| pod["status"][list].as_array().into_iter().flatten())
        .find(|s| s["name"] == container)
        .is_some_and(|s| s["state"]["terminated"].is_null())
}

/// The container a log request is for, or why there is none to read.
fn check_log_container(pod: &Value, name: &str, container: Option<&str>) -> ApiResult<String> {
    let container = crate::pods::container_named(pod, name, container)?;
    let status = [
        "initContainerStatuses",
        "containerStatuses",
        "ephemeralContainerStatuses",
    ]
    .iter()
    .flat_map(|list| pod["status"][list].as_array().into_iter().flatten())
    .find(|s| s["name"] == container.as_str());
    let waiting = match status {
        None => Some("ContainerCreating".to_owned()),
        Some(s) if s["state"]["waiting"].is_object() && s["lastState"]["terminated"].is_null() => {
            Some(
                s["state"]["waiting"]["reason"]
                    .as_str()
                    .unwrap_or("ContainerCreating")
                    .to_owned(),
            )
        }
        Some(_) => None,
    };
    match waiting {
        Some(reason) => Err(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"
        ))),
        None => Ok(container.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(texts: &[(&str, i64)]) -> Vec<LogLine> {
        texts
            .iter()
            .map(|(text, second)| LogLine {
                at: jiff::Timestamp::from_second(*second).unwrap(),
                bytes: text.as_bytes().to_vec(),
            })
            .collect()
    }

    #[test]
    fn a_log_shows_the_lines_asked_for_as_asked() {
        let log = lines(&[("a\n", 100), ("b\n", 200), ("c", 300)]);
        let show = |options: Options| String::from_utf8(options.render(log.clone())).unwrap();
        assert_eq!(show(Options::default()), "a\nb\nc");
        assert_eq!(
            show(Options {
                tail: Some(2),
                ..Default::default()
            }),
            "b\nc"
        );
        assert_eq!(
            show(Options {
                tail: Some(0),
                ..Default::default()
            }),
            ""
        );
        assert_eq!(
            show(Options {
                tail: Some(9),
                ..Default::default()
            }),
            "a\nb\nc"
        );
        assert_eq!(
            show(Options {
                since: Some(jiff::Timestamp::from_second(200).unwrap()),
                ..Default::default()
            }),
            "b\nc"
        );
        assert_eq!(
            show(Options {
                timestamps: true,
                tail: Some(1),
                ..Default::default()
            }),
            "1970-01-01T00:05:00Z c"
        );
    }

    #[test]
    fn options_refuse_what_the_real_server_refuses() {
        let parse = |pairs: &[(&str, &str)]| {
            Options::parse(
                &pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        assert!(
            parse(&[
                ("sinceSeconds", "10"),
                ("sinceTime", "2026-01-01T00:00:00Z")
            ])
            .is_err()
        );
        assert!(parse(&[("limitBytes", "0")]).is_err());
        assert!(parse(&[("tailLines", "-1")]).is_err());
        assert!(parse(&[("sinceTime", "yesterday")]).is_err());
        let options = parse(&[
            ("limitBytes", "5"),
            ("timestamps", "true"),
            ("previous", "true"),
        ])
        .unwrap();
        assert_eq!(
            (options.limit, options.timestamps, options.previous),
            (Some(5), true, true)
        );
    }
}
