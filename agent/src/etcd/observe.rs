//! One look at etcd ([`observe`]) and the hand-over of the leadership ([`hand_over`]): the
//! I/O around `view.rs`'s decisions.

use std::time::Duration;

use tokio::task::JoinSet;

use super::client::{Client, EtcdError};
use super::view::{Member, Status, View};

/// Asks this node's member for the member list and the alarms, and every member for its own
/// status, all at once. `Err` when this node's member does not answer: the guard fails then,
/// it never passes for want of an answer.
pub async fn observe(client: &Client) -> Result<View, EtcdError> {
    let list = client.members().await?;
    let alarms = client.alarms().await?;
    let mut asks = JoinSet::new();
    for (i, m) in list.members.iter().enumerate() {
        let (client, url) = (client.clone(), m.client_urls.first().cloned());
        asks.spawn(async move {
            let status = match url {
                Some(u) => client.status(&u).await,
                None => Err("it has no client URL: added but not started".to_owned()),
            };
            (i, status)
        });
    }
    let mut statuses: Vec<Option<Result<Status, String>>> = vec![None; list.members.len()];
    while let Some(done) = asks.join_next().await {
        if let Ok((i, s)) = done {
            statuses[i] = Some(s.map(|s| Status {
                leader: s.leader,
                term: s.raft_term,
                applied: s.raft_applied_index,
                errors: s.errors,
            }));
        }
    }
    let members = list
        .members
        .into_iter()
        .zip(statuses)
        .map(|(m, s)| Member {
            id: m.id,
            name: m.name,
            url: m.client_urls.into_iter().next(),
            learner: m.is_learner,
            status: s.unwrap_or_else(|| Err("its status request did not finish".to_owned())),
        })
        .collect();
    Ok(View {
        me: list.header.member_id,
        members,
        alarms: alarms
            .alarms
            .into_iter()
            .filter_map(|a| a.alarm.map(|what| (a.member_id, what)))
            .filter(|(_, what)| what != "NONE")
            .collect(),
    })
}

/// What a hand-over came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandOver {
    /// This node's member did not lead: nothing to move.
    NotLeader,
    /// The leadership moved from this node's member (`from`) to `to`, seen in `to`'s status.
    Moved { from: String, to: String },
}

/// Moves the leadership away from this node's member if it leads, to the fittest other
/// member, and waits until that member's status shows it leading. Tries `attempts` times,
/// looking again before each; `Err` says why the last try failed.
pub async fn hand_over(
    client: &Client,
    first: View,
    max_lag: u64,
    attempts: u32,
) -> Result<HandOver, String> {
    let mut view = first;
    let mut last = String::new();
    for attempt in 1..=attempts.max(1) {
        if attempt > 1 {
            view = observe(client).await.map_err(|e| e.to_string())?;
        }
        if view.leader() != Some(view.me) {
            return Ok(HandOver::NotLeader);
        }
        let Some(target) = view.successor(max_lag) else {
            last = "no other member is fit to lead".to_owned();
            continue;
        };
        let to = view.name(target);
        if let Err(e) = client.move_leader(target).await {
            last = format!("moving the leadership to {to} failed: {e}");
            continue;
        }
        let url = view
            .members
            .iter()
            .find(|m| m.id == target)
            .and_then(|m| m.url.clone());
        match seen_leading(client, url.as_deref(), target).await {
            Ok(()) => {
                return Ok(HandOver::Moved {
                    from: view.name(view.me),
                    to,
                });
            }
            Err(e) => last = format!("{to} was asked to lead but {e}"),
        }
    }
    Err(format!(
        "the leadership could not be moved away from {} in {attempts} attempt(s): {last}",
        view.name(view.me)
    ))
}

/// Waits (up to ten looks, a tenth of the timeout apart) until `target` reports itself the
/// leader.
async fn seen_leading(client: &Client, url: Option<&str>, target: u64) -> Result<(), String> {
    let Some(url) = url else {
        return Err("it has no client URL to confirm it".to_owned());
    };
    let pause = (client.timeout() / 10).max(Duration::from_millis(50));
    let mut said = String::from("it never reported itself leading");
    for _ in 0..10 {
        match client.status(url).await {
            Ok(s) if s.leader == target => return Ok(()),
            Ok(s) => said = format!("it reports the leader {}", super::hex(s.leader)),
            Err(e) => said = e,
        }
        tokio::time::sleep(pause).await;
    }
    Err(said)
}
