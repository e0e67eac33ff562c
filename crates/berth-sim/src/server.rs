//! The HTTP face of the sim: authentication and impersonation, RBAC, routing of discovery and
//! resource paths to the verbs in `sim.rs`, content negotiation (JSON, Table, metadata), and
//! the request log.

use std::{collections::HashMap, sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use crate::{
    admission_policies,
    auth::{self, API_AUDIENCE, Attributes, Identity},
    discovery,
    error::{ApiError, ApiResult, Cause},
    patch::PatchType,
    requests::RequestKey,
    resources::{Behaviour, ResourceType},
    selector::{FieldSelector, LabelSelector},
    sim::{DeleteOptions, FieldValidation, ListOptions, Sim, WriteContext, Written},
    table::{self, IncludeObject},
    watch::{self, Render, WatchRequest},
    webhooks,
};

/// What the request log records besides the response code.
#[derive(Default)]
struct LogInfo {
    user: String,
    verb: String,
    group: String,
    resource: String,
    subresource: String,
    /// The error that replaces the answer of a request carried out (an injected lost reply).
    lost_reply: Option<ApiError>,
}

/// The CertificateApproval admission plugin, for a write of a CSR's `/approval`.
fn approval_admitted(
    sim: &Sim,
    rt: &ResourceType,
    subresource: &str,
    namespace: &str,
    name: &str,
    user: &Identity,
) -> ApiResult<()> {
    if rt.group != "certificates.k8s.io" || subresource != "approval" {
        return Ok(());
    }
    match sim.store.get(&rt.storage, namespace, name) {
        Some(current) => crate::certificates::check_approval(&sim.store, user, &current),
        None => Ok(()),
    }
}

/// The user a verified client certificate names, on each request of its connection.
#[derive(Clone, Debug)]
pub struct ClientCertificate(pub Option<Identity>);

/// The one handler: every request comes here.
pub async fn handle(State(sim): State<Arc<Sim>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let client = request
        .extensions()
        .get::<ClientCertificate>()
        .and_then(|c| c.0.clone());
    let request = match pass_through(&sim, &path, request, client.as_ref()).await {
        Ok(response) => return response,
        Err(request) => request,
    };
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, 64 << 20).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return ApiError::bad_request("the request body is too large or unreadable")
                .into_response();
        }
    };
    let mut info = LogInfo {
        verb: parts.method.as_str().to_lowercase(),
        resource: parts.uri.path().to_owned(),
        ..Default::default()
    };
    let incoming = Incoming {
        method: &parts.method,
        path: parts.uri.path(),
        query: parts.uri.query().unwrap_or(""),
        headers: &parts.headers,
        client: client.as_ref(),
    };
    let response = route(&sim, incoming, bytes, &mut info)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    // The request was carried out; its answer is lost.
    let response = match info.lost_reply.take() {
        Some(error) if response.status().is_success() => error.into_response(),
        _ => response,
    };
    sim.requests.record(RequestKey {
        user: info.user,
        verb: info.verb,
        group: info.group,
        resource: info.resource,
        subresource: info.subresource,
        code: response.status().as_u16(),
    });
    response
}

/// The requests that are not objects: exec, attach and port-forward (upgraded to streams) and
/// the proxy subresources (passed on to a pod, or answered as a node's kubelet). The request
/// back when it is none of them.
async fn pass_through(
    sim: &Arc<Sim>,
    path: &str,
    request: Request,
    client: Option<&Identity>,
) -> Result<Response, Request> {
    let stream = crate::streams::target(path);
    let proxied = stream
        .is_none()
        .then(|| crate::proxy::target(path))
        .flatten();
    let node = crate::node_proxy::target(path);
    let (verb, resource, subresource) = match (&stream, &proxied, &node) {
        (Some(target), _, _) => ("create", "pods", target.subresource),
        (None, Some(target), _) => (
            crate::proxy::verb(request.method()),
            target.resource,
            "proxy",
        ),
        (None, None, Some(_)) => (crate::proxy::verb(request.method()), "nodes", "proxy"),
        (None, None, None) => return Err(request),
    };
    let (user, answer) = match authenticate(sim, request.headers(), client) {
        Err(e) => (String::new(), Err(e)),
        Ok(identity) => {
            let user = identity.username.clone();
            let answer = match (stream, proxied, node) {
                (Some(target), _, _) => {
                    crate::streams::serve(sim.clone(), identity, target, request).await
                }
                (None, Some(target), _) => {
                    crate::proxy::serve(sim.clone(), identity, target, request).await
                }
                (None, None, Some(target)) => {
                    crate::node_proxy::serve(sim.clone(), identity, target, request).await
                }
                (None, None, None) => Err(ApiError::no_such_path()),
            };
            (user, answer)
        }
    };
    let response = answer.unwrap_or_else(IntoResponse::into_response);
    sim.requests.record(RequestKey {
        user,
        verb: verb.to_owned(),
        resource: resource.to_owned(),
        subresource: subresource.to_owned(),
        code: response.status().as_u16(),
        ..Default::default()
    });
    Ok(response)
}

fn query_map(query: &str) -> HashMap<String, String> {
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The warning the real server sends with every read of ComponentStatuses.
const COMPONENT_STATUS_DEPRECATED: &str = "v1 ComponentStatus is deprecated in v1.19+";

/// Who is asking: the client certificate's user or the bearer token's identity, possibly
/// impersonating someone else.
pub(crate) fn authenticate(
    sim: &Sim,
    headers: &HeaderMap,
    client: Option<&Identity>,
) -> ApiResult<Identity> {
    let bearer = header_str(headers, "authorization").and_then(|v| v.strip_prefix("Bearer "));
    let identity = match (client, bearer) {
        (Some(user), _) => user.clone(),
        (None, bearer) => match bearer {
            Some(token) => sim
                .tokens
                .review_current(&sim.store, token.trim(), &[API_AUDIENCE.to_owned()])
                .map(|(who, _)| who)
                .map_err(|_| ApiError::Unauthorized)?,
            None => Identity::anonymous(),
        },
    };
    let Some(user) = header_str(headers, "impersonate-user") else {
        return Ok(identity);
    };
    let groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    // As the API server's impersonation filter: a service account's name is checked as that
    // service account (`serviceaccounts` in its namespace), any other as `users`; each group
    // as `groups`.
    let mut asked = vec![match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
    {
        Some((namespace, name)) => ("serviceaccounts", namespace.to_owned(), name.to_owned()),
        None => ("users", String::new(), user.to_owned()),
    }];
    asked.extend(
        groups
            .iter()
            .map(|group| ("groups", String::new(), group.clone())),
    );
    for (resource, namespace, name) in asked {
        let allowed = identity.is_superuser()
            || auth::authorize(
                &sim.store,
                &identity,
                &Attributes {
                    verb: "impersonate".into(),
                    resource: resource.into(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                    ..Default::default()
                },
            )
            .allowed;
        if !allowed {
            let scope = match namespace.is_empty() {
                true => "at the cluster scope".to_owned(),
                false => format!("in the namespace \"{namespace}\""),
            };
            return Err(ApiError::Forbidden {
                message: format!(
                    "{resource} \"{name}\" is forbidden: User \"{}\" cannot impersonate resource \"{resource}\" in API group \"\" {scope}",
                    identity.username
                ),
                kind: resource.into(),
                name: Some(name),
                group: String::new(),
            });
        }
    }
    Ok(Identity::impersonated(user, groups))
}

/// The representation the client asked for in `Accept`.
fn negotiate(headers: &HeaderMap, query: &HashMap<String, String>) -> Render {
    let accept = header_str(headers, "accept").unwrap_or_default();
    let first = accept.split(',').next().unwrap_or_default();
    if first.contains("as=Table") {
        let include = match query.get("includeObject").map(String::as_str) {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        };
        Render::Table(include)
    } else if first.contains("as=PartialObjectMetadata") {
        Render::Metadata
    } else {
        Render::Object
    }
}

fn json_response(code: StatusCode, value: &Value, warnings: &[String]) -> Response {
    let mut response = (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        crate::json::to_string(value),
    )
        .into_response();
    for warning in warnings {
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{}\"", warning.replace('"', "\\\"")))
        {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

fn decode_body(headers: &HeaderMap, bytes: &Bytes) -> ApiResult<Value> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    let content_type = header_str(headers, "content-type").unwrap_or("application/json");
    if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        crate::protobuf::decode(bytes)
    } else if content_type.contains("yaml") {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| ApiError::bad_request("the body is not UTF-8"))?;
        serde_saphyr::from_str::<Value>(text)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
    } else {
        serde_json::from_slice(bytes).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })
    }
}

/// Kubernetes derives a default field manager from the user agent's first word.
fn field_manager(query: &HashMap<String, String>, headers: &HeaderMap) -> String {
    if let Some(manager) = query.get("fieldManager") {
        return manager.clone();
    }
    header_str(headers, "user-agent")
        .and_then(|ua| ua.split('/').next())
        .unwrap_or("unknown")
        .to_owned()
}

fn non_resource(sim: &Sim, identity: &Identity, path: &str) -> ApiResult<()> {
    let attrs = Attributes {
        verb: "get".into(),
        path: Some(path.to_owned()),
        ..Default::default()
    };
    if auth::authorize(&sim.store, identity, &attrs).allowed {
        Ok(())
    } else {
        Err(auth::forbidden(identity, &attrs))
    }
}

/// A request as `route` reads it: what was asked, and who asked (a client certificate's user).
struct Incoming<'a> {
    method: &'a Method,
    path: &'a str,
    query: &'a str,
    headers: &'a HeaderMap,
    client: Option<&'a Identity>,
}

async fn route(
    sim: &Arc<Sim>,
    incoming: Incoming<'_>,
    bytes: Bytes,
    info: &mut LogInfo,
) -> ApiResult<Response> {
    let Incoming {
        method,
        path,
        query,
        headers,
        client,
    } = incoming;
    let identity = authenticate(sim, headers, client)?;
    info.user = identity.username.clone();
    let query = query_map(query);
    let path = path.trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let ok = |v: Value| Ok(json_response(StatusCode::OK, &v, &[]));
    match segments.as_slice() {
        ["version"] => {
            non_resource(sim, &identity, "/version")?;
            return ok(discovery::version());
        }
        ["healthz"] | ["livez"] | ["readyz"] => {
            non_resource(sim, &identity, path)?;
            return Ok((StatusCode::OK, "ok").into_response());
        }
        ["sim", "v1", "requests"] => {
            return ok(serde_json::to_value(sim.requests.snapshot()).unwrap_or_default());
        }
        ["api"] | ["apis"]
            if let Some((api_version, content_type)) =
                discovery::aggregated_wanted(header_str(headers, "accept").unwrap_or_default()) =>
        {
            non_resource(sim, &identity, path)?;
            let document = discovery::aggregated(&sim.registry(), path == "/api", api_version);
            return Ok((
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, content_type),
                    (header::VARY, "Accept"),
                ],
                crate::json::to_string(&document),
            )
                .into_response());
        }
        ["api"] => {
            non_resource(sim, &identity, "/api")?;
            return ok(discovery::core_versions(
                sim.address
                    .get()
                    .map(String::as_str)
                    .unwrap_or("127.0.0.1:0"),
            ));
        }
        ["apis"] => {
            non_resource(sim, &identity, "/apis")?;
            return ok(discovery::group_list(&sim.registry()));
        }
        ["apis", group] => {
            non_resource(sim, &identity, path)?;
            return discovery::group(&sim.registry(), group)
                .map(ok)
                .unwrap_or_else(|| Err(ApiError::no_such_path()));
        }
        ["openapi", "v2"] => {
            non_resource(sim, &identity, path)?;
            let document = crate::openapi::v2(&sim.registry());
            let accept = header_str(headers, "accept").unwrap_or_default();
            let (content_type, body) = if accept.contains(crate::openapi_proto::ACCEPT) {
                (
                    crate::openapi_proto::CONTENT_TYPE,
                    crate::openapi_proto::encode(&document),
                )
            } else {
                ("application/json", document.to_string().into_bytes())
            };
            return Ok((
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, content_type),
                    (header::VARY, "Accept"),
                ],
                body,
            )
                .into_response());
        }
        ["openapi", "v3"] => {
            non_resource(sim, &identity, path)?;
            return ok(crate::openapi::index(&sim.registry()));
        }
        ["openapi", "v3", "api", version] => {
            non_resource(sim, &identity, path)?;
            return ok(crate::openapi::group_version(&sim.registry(), "", version)
                .ok_or_else(ApiError::no_such_path)?);
        }
        ["openapi", "v3", "apis", group, version] => {
            non_resource(sim, &identity, path)?;
            return ok(
                crate::openapi::group_version(&sim.registry(), group, version)
                    .ok_or_else(ApiError::no_such_path)?,
            );
        }
        ["api", "v1"] => {
            non_resource(sim, &identity, path)?;
            return ok(discovery::resource_list(&sim.registry(), "", "v1")
                .ok_or_else(ApiError::no_such_path)?);
        }
        ["apis", group, version] => {
            non_resource(sim, &identity, path)?;
            return ok(discovery::resource_list(&sim.registry(), group, version)
                .ok_or_else(ApiError::no_such_path)?);
        }
        _ => {}
    }
    let (group, version, rest) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => {
            non_resource(sim, &identity, path)?;
            return Err(ApiError::no_such_path());
        }
    };
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        rest => (false, rest),
    };
    let namespaced_path = matches!(rest, ["namespaces", _, resource, ..] if sim.resource_type(group, version, resource).is_some_and(|t| t.namespaced));
    let (namespace, resource, name, subresource) = if namespaced_path {
        (rest[1], rest[2], rest.get(3).copied(), rest.get(4).copied())
    } else {
        match rest {
            [resource, more @ ..] => ("", *resource, more.first().copied(), more.get(1).copied()),
            [] => return Err(ApiError::no_such_path()),
        }
    };
    let rt = sim
        .resource_type(group, version, resource)
        .ok_or_else(ApiError::no_such_path)?;
    let name = name.unwrap_or("");
    let subresource = subresource.unwrap_or("");
    if !subresource.is_empty() && !rt.subresources.iter().any(|s| s == subresource) {
        return Err(ApiError::no_such_path());
    }
    let watching =
        legacy_watch || matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (method.as_str(), name.is_empty()) {
        ("GET", false) if watching => "watch",
        ("GET", true) if watching => "watch",
        ("GET", false) => "get",
        ("GET", true) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "delete",
        ("DELETE", true) => "deletecollection",
        _ => {
            return Err(ApiError::MethodNotAllowed {
                message: format!("{method} is not supported"),
            });
        }
    };
    info.verb = verb.to_owned();
    info.group = rt.group.clone();
    info.resource = rt.resource.clone();
    info.subresource = subresource.to_owned();
    let attrs = Attributes {
        verb: verb.to_owned(),
        group: rt.group.clone(),
        resource: rt.resource.clone(),
        subresource: subresource.to_owned(),
        namespace: namespace.to_owned(),
        name: if verb == "create" && subresource.is_empty() {
            String::new()
        } else {
            name.to_owned()
        },
        path: None,
    };
    auth::require(&sim.store, &identity, &attrs)?;
    if let Some(delay) = sim.faults.request_latency(verb, &rt.resource, namespace) {
        let _held = sim.faults.hold();
        tokio::time::sleep(delay).await;
    }
    if let Some(error) = sim.faults.request_error(verb, &rt.resource, namespace) {
        return Err(error);
    }
    info.lost_reply = sim.faults.lost_reply_error(verb, &rt.resource, namespace);
    let ctx = WriteContext {
        manager: field_manager(&query, headers),
        dry_run: query.get("dryRun").is_some_and(|d| d == "All"),
        field_validation: FieldValidation::parse(query.get("fieldValidation").map(String::as_str)),
    };
    let render = negotiate(headers, &query);
    let ns_filter = (!namespace.is_empty()).then(|| namespace.to_owned());

    if rt.behaviour == Behaviour::Review {
        if verb != "create" {
            return Err(ApiError::MethodNotAllowed {
                message: format!("{verb} is not supported on {}", rt.resource),
            });
        }
        if let Some(outage) = sim.faults.review_outage(&rt.resource) {
            return Err(outage);
        }
        let body = decode_body(headers, &bytes)?;
        let answered = review(sim, &rt, &identity, namespace, body)?;
        return Ok(json_response(StatusCode::CREATED, &answered, &[]));
    }

    if rt.behaviour == Behaviour::ReadOnly && !matches!(verb, "get" | "list") {
        return Err(ApiError::MethodNotAllowed {
            message: "the server does not allow this method on the requested resource".to_owned(),
        });
    }
    // As the real server says of every read of them.
    let deprecated: Vec<String> = match rt.resource.as_str() {
        "componentstatuses" if rt.group.is_empty() => {
            vec![COMPONENT_STATUS_DEPRECATED.to_owned()]
        }
        _ => vec![],
    };

    if subresource == "scale" && (rt.is_custom || rt.group == "apps") {
        let patch_type = match verb {
            "patch" => Some(
                PatchType::from_content_type(
                    header_str(headers, "content-type").unwrap_or_default(),
                )
                .ok_or_else(|| ApiError::UnsupportedMediaType {
                    message: "the body of the request was in an unknown format".to_owned(),
                })?,
            ),
            _ => None,
        };
        let body = match verb {
            "update" | "patch" => Some(decode_body(headers, &bytes)?),
            _ => None,
        };
        let scale = crate::scale::serve(
            sim,
            &rt,
            verb,
            namespace,
            name,
            body.as_ref().map(|b| (b, patch_type)),
            &ctx,
        )?;
        return Ok(json_response(StatusCode::OK, &scale, &[]));
    }

    match verb {
        "get" => {
            if subresource == "log" {
                return crate::logs::serve(sim, &rt, namespace, name, &query);
            }
            let object = sim.get(&rt, namespace, name)?;
            Ok(json_response(
                StatusCode::OK,
                &watch::render(&rt, &object, render),
                &deprecated,
            ))
        }
        "list" => {
            let options = list_options(&query)?;
            let exact = options.resource_version_match.as_deref() == Some("Exact");
            if options.continue_token.is_none() {
                wait_for_revision(sim, options.resource_version.as_deref(), exact).await?;
            }
            let list = sim.list(&rt, ns_filter.as_deref(), &options)?;
            let body = match render {
                Render::Object => list,
                Render::Metadata => {
                    let items: Vec<Value> = list["items"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .iter()
                        .map(|o| watch::render(&rt, o, Render::Metadata))
                        .collect();
                    json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": list["metadata"], "items": items})
                }
                Render::Table(include) => table::table(
                    &rt,
                    list["items"]
                        .as_array()
                        .map(Vec::as_slice)
                        .unwrap_or_default(),
                    list["metadata"].clone(),
                    include,
                ),
            };
            Ok(json_response(StatusCode::OK, &body, &deprecated))
        }
        "watch" => {
            let mut fields =
                FieldSelector::parse(query.get("fieldSelector").map(String::as_str).unwrap_or(""))?;
            if !name.is_empty() {
                fields.0.push(crate::selector::FieldTerm {
                    field: "metadata.name".into(),
                    value: name.to_owned(),
                    negated: false,
                });
            }
            let request = WatchRequest {
                namespace: ns_filter,
                labels: LabelSelector::parse(
                    query.get("labelSelector").map(String::as_str).unwrap_or(""),
                )?,
                fields,
                resource_version: query.get("resourceVersion").cloned(),
                send_initial_events: query.get("sendInitialEvents").is_some_and(|v| v == "true"),
                bookmarks: query
                    .get("allowWatchBookmarks")
                    .is_some_and(|v| v == "true"),
                timeout: Duration::from_secs(
                    query
                        .get("timeoutSeconds")
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(1800),
                ),
                render,
            };
            wait_for_revision(sim, request.resource_version.as_deref(), false).await?;
            let stream = watch::watch(sim.clone(), rt.clone(), request)?;
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from_stream(stream))
                .map_err(|e| ApiError::internal(e.to_string()))?)
        }
        "create" => {
            let body = decode_body(headers, &bytes)?;
            let mut body = body;
            if rt.group == "certificates.k8s.io" {
                crate::certificates::on_create(&mut body, &identity);
            }
            match (rt.resource.as_str(), subresource) {
                (_, "") => {
                    let mut warnings = vec![];
                    if admitted(sim, &rt, "", &["CREATE"]) {
                        let preview = sim.create(&rt, namespace, body.clone(), &ctx.preview())?;
                        let target = Target {
                            rt: &rt,
                            subresource: "",
                            namespace,
                        };
                        warnings = admit(sim, target, None, &preview, &identity, &ctx).await?;
                    }
                    let mut written = sim.create(&rt, namespace, body, &ctx)?;
                    written.warnings.extend(warnings);
                    Ok(written_response(&rt, written, render))
                }
                ("pods", "binding") => bind(sim, namespace, name, &body),
                ("serviceaccounts", "token") => token_request(sim, namespace, name, &body),
                ("pods", "eviction") => {
                    sim.delete(
                        &rt,
                        namespace,
                        name,
                        &DeleteOptions::from_body(&body["deleteOptions"]),
                        &ctx,
                    )?;
                    let mut status = success(&rt, name, "");
                    status["code"] = json!(201);
                    Ok(json_response(StatusCode::CREATED, &status, &[]))
                }
                _ => Err(ApiError::MethodNotAllowed {
                    message: format!("create is not supported on {}/{subresource}", rt.resource),
                }),
            }
        }
        "update" => {
            let body = decode_body(headers, &bytes)?;
            approval_admitted(sim, &rt, subresource, namespace, name, &identity)?;
            let sub = if subresource == "finalize" {
                ""
            } else {
                subresource
            };
            let mut warnings = vec![];
            if admitted(sim, &rt, sub, &["CREATE", "UPDATE"]) {
                let old = sim.store.get(&rt.storage, namespace, name);
                let preview =
                    sim.update(&rt, namespace, name, sub, body.clone(), &ctx.preview())?;
                let target = Target {
                    rt: &rt,
                    subresource: sub,
                    namespace,
                };
                warnings = admit(sim, target, old.as_deref(), &preview, &identity, &ctx).await?;
            }
            let mut written = sim.update(&rt, namespace, name, sub, body, &ctx)?;
            written.warnings.extend(warnings);
            Ok(written_response(&rt, written, render))
        }
        "patch" => {
            let content_type = header_str(headers, "content-type").unwrap_or_default();
            let patch_type = PatchType::from_content_type(content_type).ok_or_else(|| ApiError::UnsupportedMediaType {
                message: format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type})"),
            })?;
            let body = decode_body(headers, &bytes)?;
            approval_admitted(sim, &rt, subresource, namespace, name, &identity)?;
            let force = query.get("force").is_some_and(|f| f == "true");
            let mut ctx = ctx;
            if patch_type == PatchType::Apply {
                ctx.manager = query.get("fieldManager").cloned().unwrap_or_default();
                // An apply that creates the object is authorized as a create too, as the
                // real API server's patch handler does.
                if subresource.is_empty() && sim.store.get(&rt.storage, namespace, name).is_none() {
                    let create = Attributes {
                        verb: "create".to_owned(),
                        name: String::new(),
                        ..attrs.clone()
                    };
                    auth::require(&sim.store, &identity, &create)?;
                }
            }
            let mut warnings = vec![];
            if admitted(sim, &rt, subresource, &["CREATE", "UPDATE"]) {
                let old = sim.store.get(&rt.storage, namespace, name);
                let preview = sim.patch(
                    &rt,
                    namespace,
                    name,
                    subresource,
                    patch_type,
                    &body,
                    &ctx.preview(),
                    force,
                )?;
                let target = Target {
                    rt: &rt,
                    subresource,
                    namespace,
                };
                warnings = admit(sim, target, old.as_deref(), &preview, &identity, &ctx).await?;
            }
            let mut written = sim.patch(
                &rt,
                namespace,
                name,
                subresource,
                patch_type,
                &body,
                &ctx,
                force,
            )?;
            written.warnings.extend(warnings);
            Ok(written_response(&rt, written, render))
        }
        "delete" => {
            let body = decode_body(headers, &bytes)?;
            let mut options = DeleteOptions::from_body(&body);
            if let Some(grace) = query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
                options.grace_period_seconds = Some(grace);
            }
            if let Some(policy) = query.get("propagationPolicy") {
                options.propagation = Some(policy.clone());
            }
            // The admission policies that take a DELETE see the object as it is.
            if admission_policies::watched(sim, &rt, "", &["DELETE"])
                && let Some(current) = sim.store.get(&rt.storage, namespace, name)
            {
                let request = webhooks::Admission {
                    rt: &rt,
                    operation: "DELETE",
                    subresource: "",
                    namespace,
                    object: &Value::Null,
                    old: Some(&current),
                    user: &identity,
                    dry_run: ctx.dry_run,
                };
                admission_policies::validate(sim, &request)?;
            }
            let deleted = sim.delete(&rt, namespace, name, &options, &ctx)?;
            // As the real registries that return what they deleted (`ReturnDeletedObject`).
            let returns_object = !deleted.removed
                || (rt.group.is_empty()
                    && matches!(
                        rt.resource.as_str(),
                        "pods" | "namespaces" | "services" | "serviceaccounts"
                    ));
            if returns_object {
                Ok(json_response(StatusCode::OK, &deleted.object, &[]))
            } else {
                Ok(json_response(
                    StatusCode::OK,
                    &success(
                        &rt,
                        name,
                        deleted.object["metadata"]["uid"]
                            .as_str()
                            .unwrap_or_default(),
                    ),
                    &[],
                ))
            }
        }
        "deletecollection" => {
            let body = decode_body(headers, &bytes)?;
            let options = DeleteOptions::from_body(&body);
            let list = sim.list(&rt, ns_filter.as_deref(), &list_options(&query)?)?;
            let mut deleted = vec![];
            for item in list["items"].as_array().cloned().unwrap_or_default() {
                let item_ns = item["metadata"]["namespace"].as_str().unwrap_or_default();
                let item_name = item["metadata"]["name"].as_str().unwrap_or_default();
                if let Ok(d) = sim.delete(&rt, item_ns, item_name, &options, &ctx) {
                    deleted.push(d.object);
                }
            }
            let body = json!({"kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": {"resourceVersion": sim.store.revision().to_string()}, "items": deleted});
            Ok(json_response(StatusCode::OK, &body, &[]))
        }
        _ => Err(ApiError::no_such_path()),
    }
}

fn written_response(rt: &ResourceType, written: Written, render: Render) -> Response {
    let code = if written.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    json_response(
        code,
        &watch::render(rt, &written.object, render),
        &written.warnings,
    )
}

/// Asks the validating webhooks about a write that `preview` (its dry run) shows the result
/// of; `old` is the object before it, if there was one.
/// What a write is to: the resource, its subresource (`""` for the main one), the namespace.
#[derive(Clone, Copy)]
struct Target<'a> {
    rt: &'a ResourceType,
    subresource: &'a str,
    namespace: &'a str,
}

async fn admit(
    sim: &Arc<Sim>,
    Target {
        rt,
        subresource,
        namespace,
    }: Target<'_>,
    old: Option<&Value>,
    preview: &Written,
    user: &Identity,
    ctx: &WriteContext,
) -> ApiResult<Vec<String>> {
    let request = webhooks::Admission {
        rt,
        operation: if preview.created { "CREATE" } else { "UPDATE" },
        subresource,
        namespace,
        object: &preview.object,
        old,
        user,
        dry_run: ctx.dry_run,
    };
    // Policies first, then webhooks, as the real server's validating admission runs them.
    let warnings = admission_policies::validate(sim, &request)?;
    if subresource.is_empty() {
        webhooks::validate(sim, request).await?;
    }
    Ok(warnings)
}

/// Whether a write on `rt` (its `subresource`, `""` for the main resource) is previewed for
/// admission: a webhook (main resources only) or a bound policy takes it.
fn admitted(sim: &Sim, rt: &ResourceType, subresource: &str, operations: &[&str]) -> bool {
    (subresource.is_empty() && webhooks::watched(sim, rt, operations))
        || admission_policies::watched(sim, rt, subresource, operations)
}

fn success(rt: &ResourceType, name: &str, uid: &str) -> Value {
    let mut details = json!({"name": name, "kind": rt.resource});
    if !rt.group.is_empty() {
        details["group"] = json!(rt.group);
    }
    if !uid.is_empty() {
        details["uid"] = json!(uid);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

/// How long a list or watch waits for a resourceVersion the store has not reached, as the
/// real API server's watch cache does.
const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// Waits until the store has reached `resource_version` (at most [`FRESHNESS_WAIT`]; not at all
/// for an `Exact` list, which etcd answers at once), else the real 504 `Too large resource
/// version`.
async fn wait_for_revision(
    sim: &Sim,
    resource_version: Option<&str>,
    exact: bool,
) -> ApiResult<()> {
    let Some(requested) = resource_version
        .filter(|rv| !rv.is_empty() && *rv != "0")
        .and_then(|rv| rv.parse::<u64>().ok())
    else {
        return Ok(());
    };
    let deadline = tokio::time::Instant::now()
        + if exact {
            Duration::ZERO
        } else {
            FRESHNESS_WAIT
        };
    loop {
        let current = sim.store.revision();
        if requested <= current {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::TooLargeResourceVersion {
                requested,
                current,
                retry_after_seconds: if exact { 0 } else { 1 },
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn list_options(query: &HashMap<String, String>) -> ApiResult<ListOptions> {
    Ok(ListOptions {
        labels: LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fields: FieldSelector::parse(query.get("fieldSelector").map(String::as_str).unwrap_or(""))?,
        limit: query.get("limit").and_then(|l| l.parse().ok()),
        continue_token: query.get("continue").filter(|c| !c.is_empty()).cloned(),
        resource_version: query.get("resourceVersion").cloned(),
        resource_version_match: query.get("resourceVersionMatch").cloned(),
    })
}

/// `pods/<name>/binding`: what the scheduler posts to bind a pod to a node.
fn bind(sim: &Sim, namespace: &str, name: &str, body: &Value) -> ApiResult<Response> {
    let node = body["target"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "Binding",
                "",
                name,
                vec![Cause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value".into(),
                    field: "target.name".into(),
                }],
            )
        })?;
    sim.bind(namespace, name, node)?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        &[],
    ))
}

/// `serviceaccounts/<name>/token`: TokenRequest.
fn token_request(sim: &Sim, namespace: &str, name: &str, body: &Value) -> ApiResult<Response> {
    let seconds = body["spec"]["expirationSeconds"].as_i64().unwrap_or(3600);
    if seconds < 600 {
        return Err(ApiError::invalid(
            "TokenRequest",
            "authentication.k8s.io",
            name,
            vec![Cause {
                reason: "FieldValueInvalid".into(),
                message: format!(
                    "Invalid value: {seconds}: may not specify a duration less than 10 minutes"
                ),
                field: "spec.expirationSeconds".into(),
            }],
        ));
    }
    let audiences: Vec<String> = body["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let (token, expires) = sim.tokens.issue_for_account(
        &sim.store,
        namespace,
        name,
        audiences.clone(),
        Duration::from_secs(seconds as u64),
    )?;
    let audiences = if audiences.is_empty() {
        vec![API_AUDIENCE.to_owned()]
    } else {
        audiences
    };
    let response = json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": null},
        "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": body["spec"]["boundObjectRef"]},
        "status": {"token": token, "expirationTimestamp": expires.round(jiff::Unit::Second).unwrap_or(expires).to_string()}
    });
    Ok(json_response(StatusCode::CREATED, &response, &[]))
}

/// TokenReview, SubjectAccessReview and friends: answered, never stored.
fn review(
    sim: &Sim,
    rt: &ResourceType,
    identity: &Identity,
    namespace: &str,
    body: Value,
) -> ApiResult<Value> {
    let mut answer = body.clone();
    answer["apiVersion"] = json!(rt.api_version());
    answer["kind"] = json!(rt.kind);
    if !answer["metadata"].is_object() {
        answer["metadata"] = json!({});
    }
    answer["metadata"]["creationTimestamp"] = Value::Null;
    let resource_attributes = |spec: &Value| {
        let text = |field: &str| {
            spec["resourceAttributes"][field]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        Attributes {
            verb: text("verb"),
            group: text("group"),
            resource: text("resource"),
            subresource: text("subresource"),
            namespace: text("namespace"),
            name: text("name"),
            path: spec["nonResourceAttributes"]["path"]
                .as_str()
                .map(str::to_owned),
        }
    };
    let decide = |who: &Identity, spec: &Value| -> ApiResult<Value> {
        let mut attrs = resource_attributes(spec);
        if attrs.path.is_some() {
            attrs.verb = spec["nonResourceAttributes"]["verb"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        } else if spec["resourceAttributes"].is_null() {
            return Err(ApiError::invalid(&rt.kind, &rt.group, "", vec![Cause {
                reason: "FieldValueRequired".into(),
                message: "Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified".into(),
                field: "spec.resourceAttributes".into(),
            }]));
        }
        let decision = auth::authorize(&sim.store, who, &attrs);
        let mut status = json!({"allowed": decision.allowed});
        if !decision.reason.is_empty() {
            status["reason"] = json!(decision.reason);
        }
        Ok(status)
    };
    match rt.resource.as_str() {
        "tokenreviews" => {
            let token = body["spec"]["token"].as_str().unwrap_or_default();
            let wanted: Vec<String> = body["spec"]["audiences"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let wanted = if wanted.is_empty() {
                vec![API_AUDIENCE.to_owned()]
            } else {
                wanted
            };
            answer["status"] = match sim.tokens.review_current(&sim.store, token, &wanted) {
                Ok((who, audiences)) => json!({
                    "authenticated": true,
                    "user": {"username": who.username, "uid": who.uid, "groups": who.groups},
                    "audiences": audiences
                }),
                Err(error) => {
                    json!({"authenticated": false, "error": format!("[invalid bearer token, {error}]"), "user": {}})
                }
            };
        }
        "subjectaccessreviews" => {
            let spec = &body["spec"];
            let user = spec["user"].as_str().unwrap_or_default();
            let groups: Vec<String> = spec["groups"]
                .as_array()
                .map(|g| {
                    g.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            if user.is_empty() && groups.is_empty() {
                return Err(ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    "",
                    vec![Cause {
                        reason: "FieldValueInvalid".into(),
                        message:
                            "Invalid value: \"\": at least one of user or group must be specified"
                                .into(),
                        field: "spec.user,spec.groups".into(),
                    }],
                ));
            }
            let who = Identity {
                username: user.to_owned(),
                uid: spec["uid"].as_str().unwrap_or_default().to_owned(),
                groups,
            };
            answer["status"] = decide(&who, spec)?;
        }
        "localsubjectaccessreviews" => {
            let mut spec = body["spec"].clone();
            spec["resourceAttributes"]["namespace"] = json!(namespace);
            let user = spec["user"].as_str().unwrap_or_default().to_owned();
            let groups: Vec<String> = spec["groups"]
                .as_array()
                .map(|g| {
                    g.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let who = Identity {
                username: user,
                uid: String::new(),
                groups,
            };
            answer["status"] = decide(&who, &spec)?;
        }
        "selfsubjectaccessreviews" => {
            answer["status"] = decide(identity, &body["spec"])?;
        }
        "selfsubjectreviews" => {
            answer["status"] = json!({"userInfo": {"username": identity.username, "uid": identity.uid, "groups": identity.groups}});
        }
        "selfsubjectrulesreviews" => {
            let namespace = body["spec"]["namespace"].as_str().unwrap_or_default();
            if namespace.is_empty() {
                return Err(ApiError::bad_request("no namespace on request"));
            }
            let (resource_rules, non_resource_rules) =
                auth::rules_for(&sim.store, identity, namespace);
            answer["status"] = json!({
                "resourceRules": resource_rules,
                "nonResourceRules": non_resource_rules,
                "incomplete": false
            });
        }
        _ => return Err(ApiError::no_such_path()),
    }
    Ok(answer)
}

/// Whether an accept failed for that one connection only (reset or aborted before it was
/// taken): the next accept may succeed at once.
pub(crate) fn one_connection_failed(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionRefused
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
    )
}
