//! What the guard decides from one look at etcd, as pure functions: whether every member is
//! fit and the cluster keeps a quorum without this node ([`View::blockers`]), whether this
//! node's member is back and caught up ([`View::own_trouble`]), and who should lead instead
//! ([`View::successor`]). No I/O: `observe.rs` builds the view.
//!
//! The alarms come from the members' own status answers ([`alarms_in`]), which every member
//! gives from what it knows without asking its peers: asking for them through etcd's alarm
//! request goes through consensus and hangs when the cluster has lost its quorum, the moment
//! the guard most needs to say what is wrong.

/// One look at the cluster, from this node's member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The member that answered on `etcd.endpoint`: this node's.
    pub me: u64,
    pub members: Vec<Member>,
    /// Active alarms: the member and the alarm's name (`NOSPACE`, `CORRUPT`).
    pub alarms: Vec<(u64, String)>,
}

/// Splits the errors a member's status reports into the alarms among them (etcd lists each
/// active alarm there in protobuf's text form, `memberID:<id> alarm:<NAME>`) and the rest.
pub fn alarms_in(errors: Vec<String>) -> (Vec<(u64, String)>, Vec<String>) {
    let mut alarms = Vec::new();
    let mut rest = Vec::new();
    for e in errors {
        let field = |name: &str| {
            e.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim_matches('"').to_owned())
        };
        match (
            field("memberID").and_then(|m| m.parse().ok()),
            field("alarm"),
        ) {
            (Some(member), Some(alarm)) => alarms.push((member, alarm)),
            _ => rest.push(e),
        }
    }
    (alarms, rest)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    /// Empty while an added member has not started.
    pub name: String,
    /// The first of its client URLs, as the member list gives them.
    pub url: Option<String>,
    pub learner: bool,
    /// Its own status, or why it could not be asked.
    pub status: Result<Status, String>,
}

/// A member's raft status as it reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The leader it follows; 0 when it knows none.
    pub leader: u64,
    pub term: u64,
    pub applied: u64,
    /// Errors the member reports about itself (a corrupt backend, a full disk).
    pub errors: Vec<String>,
}

/// A member id as etcdctl prints it.
pub fn hex(id: u64) -> String {
    format!("{id:x}")
}

impl View {
    /// The member's name, or its id when it has none yet.
    pub fn name(&self, id: u64) -> String {
        match self.members.iter().find(|m| m.id == id) {
            Some(m) if !m.name.is_empty() => m.name.clone(),
            _ => format!("member {}", hex(id)),
        }
    }

    /// The leader as the answering member of the highest term sees it.
    pub fn leader(&self) -> Option<u64> {
        self.members
            .iter()
            .filter_map(|m| m.status.as_ref().ok())
            .filter(|s| s.leader != 0)
            .max_by_key(|s| s.term)
            .map(|s| s.leader)
    }

    fn applied_of(&self, id: u64) -> Option<u64> {
        let m = self.members.iter().find(|m| m.id == id)?;
        m.status.as_ref().ok().map(|s| s.applied)
    }

    /// What is wrong with member `id`, if anything: it does not answer, is a learner, carries
    /// an alarm, reports errors, knows no leader, or trails the leader by more than `max_lag`.
    pub fn trouble(&self, id: u64, max_lag: u64) -> Option<String> {
        let name = self.name(id);
        let Some(m) = self.members.iter().find(|m| m.id == id) else {
            return Some(format!("{name} is not in the member list"));
        };
        let status = match &m.status {
            Ok(s) => s,
            Err(e) => return Some(format!("{name} does not answer ({e})")),
        };
        let alarms: Vec<&str> = self
            .alarms
            .iter()
            .filter(|(a, _)| *a == id)
            .map(|(_, what)| what.as_str())
            .collect();
        if !alarms.is_empty() {
            return Some(format!("{name} has the alarm {}", alarms.join(", ")));
        }
        if m.learner {
            return Some(format!("{name} is a learner, still joining"));
        }
        // A member without a leader also lists etcd's "no leader" among its errors: said
        // once, in words that do not depend on etcd's.
        if status.leader == 0 {
            return Some(format!("{name} knows no leader"));
        }
        if !status.errors.is_empty() {
            return Some(format!("{name} reports: {}", status.errors.join("; ")));
        }
        let leader = self.leader()?;
        let Some(top) = self.applied_of(leader) else {
            return Some(format!(
                "{name} follows {}, which does not answer",
                self.name(leader)
            ));
        };
        let lag = top.saturating_sub(status.applied);
        (lag > max_lag).then(|| {
            format!(
                "{name} is {lag} entries behind the leader {} ({} of {top} applied; \
                 etcd.max_lag is {max_lag})",
                self.name(leader),
                status.applied
            )
        })
    }

    /// The voting members, and how many of them make a quorum.
    fn voters(&self) -> (Vec<&Member>, usize) {
        let voters: Vec<&Member> = self.members.iter().filter(|m| !m.learner).collect();
        let need = voters.len() / 2 + 1;
        (voters, need)
    }

    /// When fewer voting members answer than a quorum needs: that etcd has lost its quorum,
    /// naming the members that answer and those that do not.
    pub fn no_quorum(&self) -> Option<String> {
        let (voters, need) = self.voters();
        let (up, down): (Vec<&Member>, Vec<&Member>) =
            voters.iter().partition(|m| m.status.is_ok());
        if up.len() >= need {
            return None;
        }
        let names = |ms: &[&Member]| {
            let names: Vec<String> = ms.iter().map(|m| self.name(m.id)).collect();
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        };
        Some(format!(
            "etcd has no quorum: {} of {} voting members answer ({}), and it needs {need}; \
             no answer from {}",
            up.len(),
            voters.len(),
            names(&up),
            names(&down)
        ))
    }

    /// Why this node may not go down now; `None` when every member is fit and the members
    /// left without this node's keep a quorum.
    pub fn blockers(&self, max_lag: u64) -> Option<String> {
        let mut why: Vec<String> = Vec::new();
        if let Some(lost) = self.no_quorum() {
            why.push(lost);
        } else if self.leader().is_none() {
            why.push("etcd has no leader: no member that answers knows one".to_owned());
        }
        why.extend(
            self.members
                .iter()
                .filter_map(|m| self.trouble(m.id, max_lag)),
        );
        // Alarms on ids the member list does not hold are still the cluster's alarms.
        for (id, what) in &self.alarms {
            if !self.members.iter().any(|m| m.id == *id) {
                why.push(format!("member {} has the alarm {what}", hex(*id)));
            }
        }
        let (voters, need) = self.voters();
        let fit = voters
            .iter()
            .filter(|m| m.id != self.me && self.trouble(m.id, max_lag).is_none())
            .count();
        if fit < need {
            let mut line = format!(
                "without {} only {fit} of {} voting members would be healthy, and etcd needs {need}",
                self.name(self.me),
                voters.len()
            );
            if voters.len() == 1 {
                line.push_str(
                    "; a single member cannot go down without the API going with it: set \
                     etcd.guard = false on this node to accept that",
                );
            }
            why.push(line);
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    /// Why this node's member is not back in the cluster yet; `None` once it answers, carries
    /// no alarm and is caught up with the leader.
    pub fn own_trouble(&self, max_lag: u64) -> Option<String> {
        if let Some(lost) = self.no_quorum() {
            return Some(lost);
        }
        match self.leader() {
            None => Some("etcd has no leader: no member that answers knows one".to_owned()),
            Some(_) => self.trouble(self.me, max_lag),
        }
    }

    /// The member the leadership should go to: a voting member other than this node's, fit,
    /// the furthest applied (the lowest id of those equal).
    pub fn successor(&self, max_lag: u64) -> Option<u64> {
        self.members
            .iter()
            .filter(|m| m.id != self.me && !m.learner && self.trouble(m.id, max_lag).is_none())
            .filter_map(|m| m.status.as_ref().ok().map(|s| (s.applied, m.id)))
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, id)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LUCY: u64 = 0xa1;
    const MAKISE: u64 = 0xb2;
    const QUINN: u64 = 0xc3;

    fn member(id: u64, name: &str, leader: u64, applied: u64) -> Member {
        Member {
            id,
            name: name.into(),
            url: None,
            learner: false,
            status: Ok(Status {
                leader,
                term: 4,
                applied,
                errors: Vec::new(),
            }),
        }
    }

    /// Three members; lucy (this node) leads at applied index 1000.
    fn three() -> View {
        View {
            me: LUCY,
            members: vec![
                member(LUCY, "lucy", LUCY, 1000),
                member(MAKISE, "makise", LUCY, 998),
                member(QUINN, "quinn", LUCY, 1000),
            ],
            alarms: Vec::new(),
        }
    }

    #[test]
    fn three_fit_members_let_any_one_go() {
        let v = three();
        assert_eq!(v.blockers(100), None);
        assert_eq!(v.leader(), Some(LUCY));
        assert_eq!(v.own_trouble(100), None);
    }

    #[test]
    fn a_member_that_does_not_answer_holds_the_node_and_is_named() {
        let mut v = three();
        v.members[1].status = Err("connection refused".into());
        let why = v.blockers(100).unwrap();
        assert!(
            why.contains("makise does not answer (connection refused)"),
            "{why}"
        );
        assert!(
            why.contains(
                "without lucy only 1 of 3 voting members would be healthy, and etcd needs 2"
            ),
            "{why}"
        );
    }

    #[test]
    fn an_alarm_holds_the_node_and_names_the_member_and_the_alarm() {
        let mut v = three();
        v.alarms.push((QUINN, "NOSPACE".into()));
        let why = v.blockers(100).unwrap();
        assert!(why.starts_with("quinn has the alarm NOSPACE"), "{why}");
        // An alarm on an id not in the list is reported too.
        let mut v = three();
        v.alarms.push((0xdead, "CORRUPT".into()));
        assert!(
            v.blockers(100)
                .unwrap()
                .contains("member dead has the alarm CORRUPT")
        );
    }

    #[test]
    fn a_member_behind_by_more_than_the_bound_holds_the_node_until_it_caught_up() {
        let mut v = three();
        v.members[2].status.as_mut().unwrap().applied = 400;
        let why = v.blockers(100).unwrap();
        assert!(
            why.contains("quinn is 600 entries behind the leader lucy (400 of 1000 applied; etcd.max_lag is 100)"),
            "{why}"
        );
        assert_eq!(v.blockers(600), None, "600 behind is within a bound of 600");
        v.members[2].status.as_mut().unwrap().applied = 950;
        assert_eq!(v.blockers(100), None);
    }

    #[test]
    fn this_node_s_own_member_counts_too() {
        let mut v = three();
        v.me = MAKISE;
        v.members[1].status = Err("timed out after 2s".into());
        assert!(
            v.blockers(100)
                .unwrap()
                .starts_with("makise does not answer")
        );
        assert!(
            v.own_trouble(100)
                .unwrap()
                .starts_with("makise does not answer")
        );
    }

    #[test]
    fn no_leader_a_learner_and_reported_errors_each_hold() {
        let mut v = three();
        for m in &mut v.members {
            m.status.as_mut().unwrap().leader = 0;
        }
        let why = v.blockers(100).unwrap();
        assert!(why.starts_with("etcd has no leader"), "{why}");
        assert!(why.contains("makise knows no leader"), "{why}");

        let mut v = three();
        v.members.push(Member {
            learner: true,
            ..member(0xd4, "", LUCY, 10)
        });
        let why = v.blockers(100).unwrap();
        assert!(
            why.contains("member d4 is a learner, still joining"),
            "{why}"
        );

        let mut v = three();
        v.members[1].status.as_mut().unwrap().errors = vec!["NOSPACE".into()];
        assert!(v.blockers(100).unwrap().contains("makise reports: NOSPACE"));

        // A member cut off from its peers says "no leader" twice, in its leader field and in
        // its errors: told once, in ginx's words.
        let mut v = three();
        let s = v.members[2].status.as_mut().unwrap();
        s.leader = 0;
        s.errors = vec!["etcdserver: no leader".into()];
        let why = v.blockers(100).unwrap();
        assert!(why.contains("quinn knows no leader"), "{why}");
        assert!(!why.contains("reports"), "{why}");
    }

    #[test]
    fn a_single_member_never_passes_and_says_how_to_accept_the_outage() {
        let v = View {
            me: LUCY,
            members: vec![member(LUCY, "lucy", LUCY, 5)],
            alarms: Vec::new(),
        };
        let why = v.blockers(100).unwrap();
        assert!(why.contains("only 0 of 1 voting members"), "{why}");
        assert!(why.contains("etcd.guard = false"), "{why}");
    }

    #[test]
    fn the_successor_is_the_furthest_fit_other_member() {
        let mut v = three();
        assert_eq!(
            v.successor(100),
            Some(QUINN),
            "quinn applied more than makise"
        );
        v.members[2].status.as_mut().unwrap().applied = 998;
        assert_eq!(v.successor(100), Some(MAKISE), "equal: the lower id");
        v.alarms.push((MAKISE, "NOSPACE".into()));
        assert_eq!(
            v.successor(100),
            Some(QUINN),
            "never a member with an alarm"
        );
        v.members[2].status = Err("refused".into());
        assert_eq!(v.successor(100), None);
    }

    #[test]
    fn alarms_are_read_from_the_errors_a_status_reports() {
        let (alarms, rest) = alarms_in(vec![
            "memberID:13803658152347727308 alarm:NOSPACE ".into(),
            "etcdserver: no leader".into(),
            "memberID:17  alarm:CORRUPT".into(),
        ]);
        assert_eq!(
            alarms,
            [
                (13_803_658_152_347_727_308, "NOSPACE".to_owned()),
                (17, "CORRUPT".to_owned())
            ]
        );
        assert_eq!(rest, ["etcdserver: no leader"]);
    }

    #[test]
    fn a_lost_quorum_is_said_so_naming_the_members_that_answer_and_those_that_do_not() {
        let mut v = three();
        for m in &mut v.members {
            if let Ok(s) = m.status.as_mut() {
                s.leader = 0;
            }
        }
        v.members[1].status = Err("connection refused".into());
        v.members[2].status = Err("no answer within etcd.timeout (1s)".into());
        let why = v.blockers(100).unwrap();
        assert!(
            why.starts_with(
                "etcd has no quorum: 1 of 3 voting members answer (lucy), and it needs 2; \
                 no answer from makise, quinn"
            ),
            "{why}"
        );
        assert!(!why.contains("etcd has no leader"), "said once: {why}");
        assert!(
            why.contains("makise does not answer (connection refused)"),
            "{why}"
        );
        assert!(
            v.own_trouble(100)
                .unwrap()
                .starts_with("etcd has no quorum")
        );
        // One member down of three: a quorum still, no such words.
        let mut v = three();
        v.members[2].status = Err("refused".into());
        assert_eq!(v.no_quorum(), None);
        assert!(!v.blockers(100).unwrap().contains("no quorum"));
    }

    #[test]
    fn the_own_member_is_back_only_once_caught_up() {
        let mut v = three();
        v.me = MAKISE;
        v.members[1].status.as_mut().unwrap().applied = 10;
        let why = v.own_trouble(100).unwrap();
        assert!(
            why.starts_with("makise is 990 entries behind the leader lucy"),
            "{why}"
        );
        v.members[1].status.as_mut().unwrap().applied = 999;
        assert_eq!(v.own_trouble(100), None);
    }
}
