//! NetworkPolicy (networking.k8s.io/v1) validation, as the real API server's
//! `ValidateNetworkPolicySpec`: ports, peers and policy types. The sim stores policies and
//! serves them to clients; it does not enforce them (no pod traffic is filtered).

use serde_json::Value;

use crate::error::Cause;

fn cause(reason: &str, field: String, message: String) -> Cause {
    Cause {
        reason: reason.to_owned(),
        message,
        field,
    }
}

fn check_port(port: &Value, field: &str, causes: &mut Vec<Cause>) {
    if let Some(protocol) = port["protocol"].as_str()
        && !["TCP", "UDP", "SCTP"].contains(&protocol)
    {
        causes.push(cause(
            "FieldValueNotSupported",
            format!("{field}.protocol"),
            format!(
                "Unsupported value: \"{protocol}\": supported values: \"SCTP\", \"TCP\", \"UDP\""
            ),
        ));
    }
    let number = port["port"].as_i64();
    if let Some(n) = number
        && !(1..=65535).contains(&n)
    {
        causes.push(cause(
            "FieldValueInvalid",
            format!("{field}.port"),
            format!("Invalid value: {n}: must be between 1 and 65535, inclusive"),
        ));
    }
    if let Some(end) = port["endPort"].as_i64() {
        if port["port"].is_null() {
            causes.push(cause(
                "FieldValueRequired",
                format!("{field}.port"),
                "Required value: when endPort is specified".to_owned(),
            ));
        } else if port["port"].is_string() {
            causes.push(cause(
                "FieldValueForbidden",
                format!("{field}.endPort"),
                "Forbidden: may not be specified when `port` is non-numeric".to_owned(),
            ));
        } else if number.is_some_and(|n| end < n) {
            causes.push(cause(
                "FieldValueInvalid",
                format!("{field}.endPort"),
                format!("Invalid value: {end}: must be greater than or equal to `port`"),
            ));
        }
    }
}

fn check_peer(peer: &Value, field: &str, causes: &mut Vec<Cause>) {
    let selectors = ["podSelector", "namespaceSelector"]
        .iter()
        .filter(|k| !peer[**k].is_null())
        .count();
    let block = &peer["ipBlock"];
    if selectors == 0 && block.is_null() {
        causes.push(cause(
            "FieldValueRequired",
            field.to_owned(),
            "Required value: must specify a peer".to_owned(),
        ));
    } else if selectors > 0 && !block.is_null() {
        causes.push(cause(
            "FieldValueForbidden",
            field.to_owned(),
            "Forbidden: may not specify both ipBlock and another peer".to_owned(),
        ));
    }
    if let Some(cidr) = block["cidr"].as_str()
        && !is_cidr(cidr)
    {
        causes.push(cause(
            "FieldValueInvalid",
            format!("{field}.ipBlock.cidr"),
            format!("Invalid value: \"{cidr}\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"),
        ));
    }
}

/// `10.9.8.0/24`, `2001:db8::/64`.
fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix <= 32,
        Ok(std::net::IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}

/// The causes of refusing `policy`, none when it is valid.
pub fn validate(policy: &Value) -> Vec<Cause> {
    let spec = &policy["spec"];
    let mut causes = vec![];
    for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
        for (i, rule) in spec[direction].as_array().into_iter().flatten().enumerate() {
            let base = format!("spec.{direction}[{i}]");
            for (j, port) in rule["ports"].as_array().into_iter().flatten().enumerate() {
                check_port(port, &format!("{base}.ports[{j}]"), &mut causes);
            }
            for (j, peer) in rule[peers].as_array().into_iter().flatten().enumerate() {
                check_peer(peer, &format!("{base}.{peers}[{j}]"), &mut causes);
            }
        }
    }
    for (i, kind) in spec["policyTypes"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let kind = kind.as_str().unwrap_or_default();
        if !["Ingress", "Egress"].contains(&kind) {
            causes.push(cause(
                "FieldValueNotSupported",
                format!("spec.policyTypes[{i}]"),
                format!("Unsupported value: \"{kind}\": supported values: \"Ingress\", \"Egress\""),
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ports_peers_and_types_as_the_real_server_checks_them() {
        let policy = json!({"spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Sideways"],
            "ingress": [{
                "from": [{}, {"podSelector": {}, "ipBlock": {"cidr": "10.0.0.0/8"}}, {"ipBlock": {"cidr": "nope"}}],
                "ports": [{"protocol": "TCP", "port": 1, "endPort": 65535}, {"port": 80, "endPort": 10}, {"protocol": "ICMP", "port": 0}]
            }]
        }});
        let found: Vec<String> = validate(&policy)
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert_eq!(
            found,
            [
                "spec.ingress[0].ports[1].endPort: Invalid value: 10: must be greater than or equal to `port`",
                "spec.ingress[0].ports[2].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                "spec.ingress[0].ports[2].port: Invalid value: 0: must be between 1 and 65535, inclusive",
                "spec.ingress[0].from[0]: Required value: must specify a peer",
                "spec.ingress[0].from[1]: Forbidden: may not specify both ipBlock and another peer",
                "spec.ingress[0].from[2].ipBlock.cidr: Invalid value: \"nope\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                "spec.policyTypes[1]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\"",
            ]
        );
    }
}
