//! One look at etcd ([`observe`]) and the hand-over of the leadership ([`hand_over`]): the
//! I/O around `view.rs`'s decisions.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;

use super::client::{Client, EtcdError, RequestError};
use super::view::{Member, Status, View, alarms_in};

/// Asks this node's member for the member list, and every member for its own status, all at
/// once; the alarms are what the statuses report (see `view.rs`). None of these requests
/// needs a quorum: with one lost, the members that still answer say so. `Err` when this
/// node's member does not answer: the guard fails then, it never passes for want of an
/// answer.
pub async fn observe(client: &Client) -> Result<View, EtcdError> {
    let list = client.members().await?;
    let mut asks = JoinSet::new();
    for (i, m) in list.members.iter().enumerate() {
        let (client, url) = (client.clone(), m.client_urls.first().cloned());
        asks.spawn(async move {
            let status = match url {
                Some(u) => client.status(&u).await.map_err(|e| e.to_string()),
                None => Err("it has no client URL: added but not started".to_owned()),
            };
            (i, status)
        });
    }
    let mut statuses: Vec<Option<Result<Status, String>>> = vec![None; list.members.len()];
    let mut alarms: Vec<(u64, String)> = Vec::new();
    while let Some(done) = asks.join_next().await {
        if let Ok((i, s)) = done {
            statuses[i] = Some(s.map(|s| {
                let (theirs, errors) = alarms_in(s.errors);
                alarms.extend(theirs);
                Status {
                    leader: s.leader,
                    term: s.raft_term,
                    applied: s.raft_applied_index,
                    errors,
                }
            }));
        }
    }
    alarms.sort();
    alarms.dedup();
    alarms.retain(|(_, what)| what != "NONE");
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
        alarms,
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

/// What the hand-over asks of etcd: [`Client`] in ginx, a scripted cluster in the tests.
/// Its futures are `Send`: the hand-over runs in the reconciler's task.
pub trait Leadership {
    /// One look at the cluster.
    fn look(&self) -> impl Future<Output = Result<View, EtcdError>> + Send;
    /// Asks this node's member, the leader, to hand the leadership to `target`.
    fn move_to(&self, target: u64) -> impl Future<Output = Result<(), RequestError>> + Send;
    /// The leader the member at `url` follows, by its own status.
    fn leader_at(&self, url: &str) -> impl Future<Output = Result<u64, RequestError>> + Send;
    /// How long to wait between looks at the new leader.
    fn pause(&self) -> Duration;
}

impl Leadership for Client {
    async fn look(&self) -> Result<View, EtcdError> {
        observe(self).await
    }

    async fn move_to(&self, target: u64) -> Result<(), RequestError> {
        self.move_leader(target).await
    }

    async fn leader_at(&self, url: &str) -> Result<u64, RequestError> {
        self.status(url).await.map(|s| s.leader)
    }

    fn pause(&self) -> Duration {
        (self.timeout() / 10).max(Duration::from_millis(50))
    }
}

/// Why the last look before a disruption did not let this node go down.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    /// The cluster cannot lose this node's member now, or could not be looked at: why.
    #[error("{0}")]
    Cluster(String),
    /// This node's member leads and the leadership could not be moved away: why.
    #[error("{0}")]
    Leading(String),
}

/// The last look before a disruption: the cluster must be able to lose this node's member
/// ([`View::blockers`]), and then, if that member leads and `move_leader` is on, the
/// leadership goes to the fittest other member, confirmed by that member's status. Each try
/// judges a look of its own (the first is `first`), so the move follows the look that found
/// the cluster fit; `attempts` tries, looking again before each.
pub async fn hand_over(
    etcd: &impl Leadership,
    first: View,
    max_lag: u64,
    attempts: u32,
    move_leader: bool,
) -> Result<HandOver, Unfit> {
    let mut view = first;
    let mut last = String::new();
    for attempt in 1..=attempts.max(1) {
        if attempt > 1 {
            view = etcd
                .look()
                .await
                .map_err(|e| Unfit::Cluster(e.to_string()))?;
        }
        if let Some(why) = view.blockers(max_lag) {
            return Err(Unfit::Cluster(why));
        }
        if !move_leader || view.leader() != Some(view.me) {
            return Ok(HandOver::NotLeader);
        }
        let Some(target) = view.successor(max_lag) else {
            last = "no other member is fit to lead".to_owned();
            continue;
        };
        let to = view.name(target);
        if let Err(e) = etcd.move_to(target).await {
            last = format!("moving the leadership to {to} failed: {e}");
            continue;
        }
        let url = view
            .members
            .iter()
            .find(|m| m.id == target)
            .and_then(|m| m.url.clone());
        match seen_leading(etcd, url.as_deref(), target).await {
            Ok(()) => {
                return Ok(HandOver::Moved {
                    from: view.name(view.me),
                    to,
                });
            }
            Err(e) => last = format!("{to} was asked to lead but {e}"),
        }
    }
    Err(Unfit::Leading(format!(
        "the leadership could not be moved away from {} in {attempts} attempt(s): {last}",
        view.name(view.me)
    )))
}

/// Why a member asked to lead was not seen leading.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum Unconfirmed {
    #[error("it has no client URL to confirm it")]
    NoUrl,
    #[error("it never reported itself leading")]
    Never,
    #[error("it reports the leader {}", super::hex(*.0))]
    Follows(u64),
    #[error("{0}")]
    Asked(RequestError),
}

/// Waits (up to ten looks, [`Leadership::pause`] apart) until `target` reports itself the
/// leader.
async fn seen_leading(
    etcd: &impl Leadership,
    url: Option<&str>,
    target: u64,
) -> Result<(), Unconfirmed> {
    let Some(url) = url else {
        return Err(Unconfirmed::NoUrl);
    };
    let mut said = Unconfirmed::Never;
    for _ in 0..10 {
        match etcd.leader_at(url).await {
            Ok(l) if l == target => return Ok(()),
            Ok(l) => said = Unconfirmed::Follows(l),
            Err(e) => said = Unconfirmed::Asked(e),
        }
        tokio::time::sleep(etcd.pause()).await;
    }
    Err(said)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::etcd::{Member, Status};

    /// A cluster of lucy (this node, leading), makise and quinn, whose answers are scripted.
    struct Scripted {
        /// Each move's answer, in order; the moves asked for are recorded.
        moves: Mutex<Vec<Result<(), RequestError>>>,
        asked: Mutex<Vec<u64>>,
        /// The leader the target reports after a move that succeeded.
        leader_after: u64,
        looks: Mutex<u32>,
    }

    fn view() -> View {
        let m = |id: u64, name: &str, applied: u64| Member {
            id,
            name: name.into(),
            url: Some(format!("https://{name}:2379")),
            learner: false,
            status: Ok(Status {
                leader: 1,
                term: 2,
                applied,
                errors: Vec::new(),
            }),
        };
        View {
            me: 1,
            members: vec![m(1, "lucy", 100), m(2, "makise", 99), m(3, "quinn", 100)],
            alarms: Vec::new(),
        }
    }

    impl Leadership for Scripted {
        async fn look(&self) -> Result<View, EtcdError> {
            *self.looks.lock().unwrap() += 1;
            Ok(view())
        }
        async fn move_to(&self, target: u64) -> Result<(), RequestError> {
            self.asked.lock().unwrap().push(target);
            self.moves.lock().unwrap().remove(0)
        }
        async fn leader_at(&self, _url: &str) -> Result<u64, RequestError> {
            Ok(self.leader_after)
        }
        fn pause(&self) -> Duration {
            Duration::from_millis(1)
        }
    }

    /// The leader's answer to a move that did not finish in time.
    fn timeout() -> RequestError {
        RequestError::Answered {
            member: "https://lucy:2379".into(),
            path: "/v3/maintenance/transfer-leadership",
            status: 500,
            said: "leader transfer timeout".into(),
        }
    }

    fn scripted(moves: Vec<Result<(), RequestError>>, leader_after: u64) -> Scripted {
        Scripted {
            moves: Mutex::new(moves),
            asked: Mutex::default(),
            leader_after,
            looks: Mutex::new(0),
        }
    }

    #[tokio::test]
    async fn a_leader_hands_over_to_the_furthest_member_and_sees_it_lead() {
        let etcd = scripted(vec![Ok(())], 3);
        let done = hand_over(&etcd, view(), 10, 3, true).await.unwrap();
        assert_eq!(
            done,
            HandOver::Moved {
                from: "lucy".into(),
                to: "quinn".into()
            }
        );
        assert_eq!(*etcd.asked.lock().unwrap(), [3]);
    }

    #[tokio::test]
    async fn a_failed_move_is_retried_after_a_fresh_look() {
        let etcd = scripted(vec![Err(timeout()), Ok(())], 3);
        assert!(hand_over(&etcd, view(), 10, 3, true).await.is_ok());
        assert_eq!(etcd.asked.lock().unwrap().len(), 2);
        assert_eq!(
            *etcd.looks.lock().unwrap(),
            1,
            "one fresh look before the second try"
        );
    }

    #[tokio::test]
    async fn moves_that_fail_or_are_not_seen_end_in_a_reason_to_wait() {
        let failing = scripted(vec![Err(timeout()); 2], 3);
        let why = hand_over(&failing, view(), 10, 2, true).await.unwrap_err();
        assert_eq!(
            why.to_string(),
            "the leadership could not be moved away from lucy in 2 attempt(s): moving the \
             leadership to quinn failed: https://lucy:2379/v3/maintenance/transfer-leadership \
             answered 500: leader transfer timeout"
        );
        // The move is answered, but quinn keeps reporting lucy as the leader.
        let unseen = scripted(vec![Ok(())], 1);
        let why = hand_over(&unseen, view(), 10, 1, true)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            why.ends_with("quinn was asked to lead but it reports the leader 1"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_member_that_does_not_lead_moves_nothing() {
        let etcd = scripted(Vec::new(), 3);
        let mut v = view();
        v.me = 2;
        assert_eq!(
            hand_over(&etcd, v, 10, 3, true).await,
            Ok(HandOver::NotLeader)
        );
        assert!(etcd.asked.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_cluster_that_cannot_lose_this_member_moves_nothing_and_says_why() {
        let etcd = scripted(vec![Ok(())], 3);
        let mut v = view();
        v.members[1].status = Err("connection refused".into());
        let why = hand_over(&etcd, v, 10, 3, true).await.unwrap_err();
        let Unfit::Cluster(why) = why else {
            panic!("the cluster's unfitness, not the move's: {why:?}");
        };
        assert!(why.contains("makise does not answer"), "{why}");
        assert!(etcd.asked.lock().unwrap().is_empty(), "no move asked");
        // With the hand-over off the look still judges the cluster.
        let mut v = view();
        v.alarms.push((3, "NOSPACE".into()));
        let why = hand_over(&etcd, v, 10, 3, false).await.unwrap_err();
        assert!(
            why.to_string().contains("quinn has the alarm NOSPACE"),
            "{why}"
        );
        assert_eq!(
            hand_over(&etcd, view(), 10, 3, false).await,
            Ok(HandOver::NotLeader),
            "a fit cluster, no move wanted"
        );
    }

    #[tokio::test]
    async fn a_member_that_fails_between_two_tries_stops_the_hand_over() {
        // The first move fails; the fresh look before the second try finds makise gone.
        struct Failing(Scripted);
        impl Leadership for Failing {
            async fn look(&self) -> Result<View, EtcdError> {
                let mut v = view();
                v.members[1].status = Err("connection refused".into());
                Ok(v)
            }
            async fn move_to(&self, target: u64) -> Result<(), RequestError> {
                self.0.move_to(target).await
            }
            async fn leader_at(&self, url: &str) -> Result<u64, RequestError> {
                self.0.leader_at(url).await
            }
            fn pause(&self) -> Duration {
                self.0.pause()
            }
        }
        let etcd = Failing(scripted(vec![Err(timeout()), Ok(())], 3));
        let why = hand_over(&etcd, view(), 10, 3, true).await.unwrap_err();
        assert!(
            matches!(&why, Unfit::Cluster(w) if w.contains("makise does not answer")),
            "{why:?}"
        );
        assert_eq!(etcd.0.asked.lock().unwrap().len(), 1, "no second move");
    }
}
