//! What this node answered: the requests it has answered (so that each is answered once, across
//! restarts) and the answers it still shows, in `<state_dir>/previews/answers.json`. An answer
//! is shown while its request stands in the ConfigMap; `ginxctl plan` removes requests an hour
//! old, and the answer goes with it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::types::preview::MAX_REQUESTS;
use crate::types::{PlanRequest, PreviewAnswer};

/// Request ids remembered as answered (the oldest forgotten first): far more than can stand.
const MAX_IDS: usize = 64;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Answered {
    /// The ids answered, oldest first.
    pub ids: Vec<String>,
    /// The answers shown, oldest first.
    pub answers: Vec<PreviewAnswer>,
}

impl Answered {
    /// The requests of `standing` that ask a node of `group` and are not answered yet, oldest
    /// first (by when they were asked, then by id).
    pub fn to_answer<'a>(
        &self,
        standing: &'a BTreeMap<String, PlanRequest>,
        group: &str,
    ) -> Vec<(&'a String, &'a PlanRequest)> {
        let mut todo: Vec<(&String, &PlanRequest)> = standing
            .iter()
            .filter(|(id, r)| !self.ids.contains(id) && r.asks(group))
            .collect();
        todo.sort_by(|a, b| (a.1.at, a.0).cmp(&(b.1.at, b.0)));
        todo
    }

    /// Records `answer`: its id is answered, and it is shown in place of an older one.
    pub fn record(&mut self, answer: PreviewAnswer) {
        if !self.ids.contains(&answer.id) {
            self.ids.push(answer.id.clone());
        }
        let extra = self.ids.len().saturating_sub(MAX_IDS);
        self.ids.drain(..extra);
        self.answers.retain(|a| a.id != answer.id);
        self.answers.push(answer);
        let extra = self.answers.len().saturating_sub(MAX_REQUESTS);
        self.answers.drain(..extra);
    }

    /// Keeps only the answers to requests that still stand; whether any went.
    pub fn retain(&mut self, standing: &BTreeMap<String, PlanRequest>) -> bool {
        let before = self.answers.len();
        self.answers.retain(|a| standing.contains_key(&a.id));
        self.answers.len() != before
    }
}

/// Reads the file; a missing or unreadable one is nothing answered (a request may then be
/// answered twice, which costs a build and harms nothing).
pub fn load(path: &Path) -> Answered {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

pub fn save(path: &Path, answered: &Answered) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(answered).map_err(std::io::Error::other)?;
    crate::state::write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;

    fn request(at: i64) -> PlanRequest {
        PlanRequest {
            reference: "feature".into(),
            by: "alice@desk".into(),
            at: Timestamp::from_second(at).unwrap(),
            groups: Vec::new(),
        }
    }

    fn answer(id: &str) -> PreviewAnswer {
        PreviewAnswer {
            error: Some("x".into()),
            took_ms: 1,
            ..PreviewAnswer::new(id, "feature", Timestamp::UNIX_EPOCH)
        }
    }

    #[test]
    fn each_request_is_answered_once_oldest_first_and_shown_while_it_stands() {
        let mut standing = BTreeMap::new();
        standing.insert("b".to_owned(), request(20));
        standing.insert("a".to_owned(), request(30));
        standing.insert("c".to_owned(), request(10));
        let mut done = Answered::default();
        let order: Vec<&String> = done
            .to_answer(&standing, "workers")
            .into_iter()
            .map(|t| t.0)
            .collect();
        assert_eq!(order, ["c", "b", "a"]);
        done.record(answer("c"));
        done.record(answer("c"));
        assert_eq!(done.ids, ["c"]);
        assert_eq!(done.answers.len(), 1);
        assert_eq!(done.to_answer(&standing, "workers").len(), 2);
        standing.remove("c");
        assert!(done.retain(&standing));
        assert!(done.answers.is_empty());
        // Removed, it is still answered: a request put back under the same id is not built again.
        standing.insert("c".to_owned(), request(10));
        assert_eq!(done.to_answer(&standing, "workers").len(), 2);
        assert!(!done.retain(&standing));
        // A request for another group is not this node's.
        standing.insert(
            "d".to_owned(),
            PlanRequest {
                groups: vec!["cp".into()],
                ..request(5)
            },
        );
        assert_eq!(done.to_answer(&standing, "workers").len(), 2);
        assert_eq!(done.to_answer(&standing, "cp").len(), 3);
    }

    #[test]
    fn what_is_kept_is_bounded() {
        let mut done = Answered::default();
        for i in 0..100 {
            done.record(answer(&format!("r{i}")));
        }
        assert_eq!(done.ids.len(), MAX_IDS);
        assert_eq!(done.ids[0], "r36");
        assert_eq!(done.answers.len(), MAX_REQUESTS);
        assert_eq!(done.answers[0].id, "r92");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("answers.json");
        assert_eq!(load(&path), Answered::default());
        save(&path, &done).unwrap();
        assert_eq!(load(&path), done);
        std::fs::write(&path, "{").unwrap();
        assert_eq!(load(&path), Answered::default());
    }
}
