//! `ginxctl hold NODE… [--reason R] [--until TIME]` and `ginxctl release NODE…`: an operator
//! keeps nodes out of rollouts, from a workstation or a node, with their own credentials
//! (`operator.rs` finds them and refuses the node's own). One write of the fleet's ConfigMap
//! for all the nodes named; what a hold means is admission's business.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use jiff::Timestamp;
use jiff::tz::TimeZone;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;

use super::render::terminal_safe;
use crate::config::Config;
use crate::rollout::fleet::holds::{self, Changed, Hold, MAX_NODES};
use crate::rollout::fleet::operator::{self, Change};
use crate::types::Invalid;

/// What `ginxctl hold` was asked, checked.
#[derive(Debug, PartialEq)]
pub struct Asked {
    pub nodes: Vec<String>,
    pub reason: String,
    pub until: Option<Timestamp>,
}

/// Checks what `ginxctl hold` was given before anything is asked of the API: the names, the
/// reason, and `until` read at `now` in the workstation's `local` zone.
pub fn check(
    nodes: &[String],
    reason: &str,
    until: Option<&str>,
    now: Timestamp,
    local: &TimeZone,
) -> Result<Asked, Invalid> {
    let nodes = check_nodes(nodes)?;
    holds::check_reason(reason)?;
    let until = until
        .map(|u| holds::parse_until(u, now, local))
        .transpose()?;
    Ok(Asked {
        nodes,
        reason: reason.trim().to_owned(),
        until,
    })
}

/// The names, each a node name, without repeats, at most [`MAX_NODES`].
pub fn check_nodes(nodes: &[String]) -> Result<Vec<String>, Invalid> {
    if nodes.len() > MAX_NODES {
        return Err(Invalid(format!(
            "{} nodes named; at most {MAX_NODES} at once",
            nodes.len()
        )));
    }
    let mut seen = Vec::new();
    for n in nodes {
        holds::check_node(n)?;
        if !seen.contains(n) {
            seen.push(n.clone());
        }
    }
    Ok(seen)
}

/// The names no Node has (404), and a warning when Nodes cannot be read: a typo should not
/// hold a node that does not exist while the one meant goes on.
pub async fn missing(client: &kube::Client, nodes: &[String]) -> (Vec<String>, Option<String>) {
    let api = Api::<Node>::all(client.clone());
    let mut missing = Vec::new();
    for n in nodes {
        match api.get_opt(n).await {
            Ok(Some(_)) => {}
            Ok(None) => missing.push(n.clone()),
            Err(e) => {
                return (
                    missing,
                    Some(format!(
                        "cannot look the nodes up ({}); holding them as named",
                        crate::k8s::describe(&e)
                    )),
                );
            }
        }
    }
    (missing, None)
}

/// Places the hold (one write), and says what it did.
pub async fn hold(
    client: &kube::Client,
    cfg: &Config,
    asked: &Asked,
    by: &str,
    force: bool,
) -> Result<String, (u8, String)> {
    let mut out = String::new();
    let (missing, warning) = missing(client, &asked.nodes).await;
    if let Some(w) = warning {
        let _ = writeln!(out, "warning: {w}");
    }
    if !missing.is_empty() && !force {
        return Err((
            1,
            format!(
                "no Node {} in the cluster (a typo?); --force holds it anyway",
                missing.join(", ")
            ),
        ));
    }
    let now = crate::util::now();
    let hold = Hold {
        by: by.to_owned(),
        at: now,
        reason: asked.reason.clone(),
        until: asked.until,
    };
    let changed = write(client, cfg, |data| {
        holds::apply_hold(data, &asked.nodes, &hold, now)
    })
    .await?;
    out.push_str(&held_words(&changed, &hold));
    Ok(out)
}

/// Lifts the holds (one write), and says what it did.
pub async fn release(
    client: &kube::Client,
    cfg: &Config,
    nodes: &[String],
    by: &str,
) -> Result<String, (u8, String)> {
    let now = crate::util::now();
    let changed = write(client, cfg, |data| {
        holds::apply_release(data, nodes, by, now)
    })
    .await?;
    Ok(released_words(&changed))
}

async fn write(
    client: &kube::Client,
    cfg: &Config,
    edit: impl FnMut(&mut BTreeMap<String, String>) -> Vec<Changed>,
) -> Result<Vec<Changed>, (u8, String)> {
    let ns = &cfg.kubernetes.namespace;
    let api = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let mut edit = edit;
    operator::edit_data(
        &api,
        ns,
        &cfg.rollout.configmap,
        "placing or lifting a hold",
        |data| Ok(Change::Write(edit(data))),
    )
    .await
    .map_err(|e| (1, e.to_string()))
}

/// `held lucy until T (disk failing): …`, one line per node, saying what a re-hold replaced.
pub fn held_words(changed: &[Changed], hold: &Hold) -> String {
    let until = hold.until.map_or_else(
        || "until `ginxctl release`".to_owned(),
        |u| format!("until {u}"),
    );
    let why = if hold.reason.is_empty() {
        String::new()
    } else {
        format!(" ({})", hold.reason)
    };
    let mut o = String::new();
    for c in changed {
        let _ = write!(
            o,
            "held {} {until}{why}: it starts nothing new; a slot it holds finishes what it started",
            c.node
        );
        if let Some(before) = &c.before {
            let _ = write!(o, " (replaces the hold {})", before.describe());
        }
        o.push('\n');
    }
    terminal_safe(&o)
}

/// `released lucy (held by ann since T …)` or `lucy was not held`, one line per node.
pub fn released_words(changed: &[Changed]) -> String {
    let mut o = String::new();
    for c in changed {
        let _ = match &c.before {
            Some(h) => writeln!(o, "released {} (held {})", c.node, h.describe()),
            None => writeln!(o, "{} was not held", c.node),
        };
    }
    terminal_safe(&o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn what_hold_is_given_is_checked_before_the_api_is_asked() {
        let now = t("2026-12-01T10:00:00Z");
        let utc = TimeZone::UTC;
        let a = check(&names(&["w2", "w3", "w2"]), " disk ", Some("8h"), now, &utc).unwrap();
        assert_eq!(
            a,
            Asked {
                nodes: names(&["w2", "w3"]),
                reason: "disk".into(),
                until: Some(t("2026-12-01T18:00:00Z")),
            }
        );
        let e = check(&names(&["W3"]), "", None, now, &utc).unwrap_err();
        assert!(e.0.contains("\"W3\" is not a node name"), "{e}");
        let e = check(&names(&["w3"]), "", Some("tomorrow"), now, &utc).unwrap_err();
        assert!(e.0.contains("is not a time"), "{e}");
        let many: Vec<String> = (0..65).map(|i| format!("w{i}")).collect();
        let e = check(&many, "", None, now, &utc).unwrap_err();
        assert!(e.0.contains("at most 64"), "{e}");
    }

    #[test]
    fn the_words_say_until_when_what_was_replaced_and_what_was_not_held() {
        let hold = Hold {
            by: "ann".into(),
            at: t("2026-12-01T10:00:00Z"),
            reason: "disk failing".into(),
            until: Some(t("2026-12-01T18:00:00Z")),
        };
        let changed = vec![
            Changed {
                node: "w2".into(),
                before: None,
            },
            Changed {
                node: "w3".into(),
                before: Some(Hold {
                    until: None,
                    ..hold.clone()
                }),
            },
        ];
        assert_eq!(
            held_words(&changed, &hold),
            "held w2 until 2026-12-01T18:00:00Z (disk failing): it starts nothing new; a slot \
             it holds finishes what it started\n\
             held w3 until 2026-12-01T18:00:00Z (disk failing): it starts nothing new; a slot \
             it holds finishes what it started (replaces the hold by ann since \
             2026-12-01T10:00:00Z (disk failing) until `ginxctl release`)\n"
        );
        assert_eq!(
            released_words(&changed),
            "w2 was not held\nreleased w3 (held by ann since 2026-12-01T10:00:00Z (disk \
             failing) until `ginxctl release`)\n"
        );
    }
}
