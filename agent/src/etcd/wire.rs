//! The JSON of etcd's v3 gateway, as grpc-gateway writes it with protojson (`UseProtoNames`,
//! unpopulated fields left out): 64-bit integers are strings, enums their names, and a zero
//! value is absent.

use serde::{Deserialize, Deserializer};

/// A protojson 64-bit integer: a string of digits (a bare number is read too).
fn u64_text<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Text(String),
        Number(u64),
    }
    match Either::deserialize(d)? {
        Either::Number(n) => Ok(n),
        Either::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct Header {
    #[serde(default, deserialize_with = "u64_text")]
    pub member_id: u64,
}

#[derive(Debug, Deserialize)]
pub struct MemberListResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub members: Vec<WireMember>,
}

#[derive(Debug, Deserialize)]
pub struct WireMember {
    #[serde(rename = "ID", default, deserialize_with = "u64_text")]
    pub id: u64,
    /// Empty while a member added is not started yet.
    #[serde(default)]
    pub name: String,
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Vec<String>,
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

#[derive(Debug, Deserialize)]
pub struct StatusResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default, deserialize_with = "u64_text")]
    pub leader: u64,
    #[serde(rename = "raftTerm", default, deserialize_with = "u64_text")]
    pub raft_term: u64,
    #[serde(rename = "raftAppliedIndex", default, deserialize_with = "u64_text")]
    pub raft_applied_index: u64,
    #[serde(default)]
    pub errors: Vec<String>,
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

/// An error body of the gateway: `{"error": "...", "code": N, "message": "..."}`.
#[derive(Debug, Default, Deserialize)]
pub struct ErrorBody {
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixty_four_bit_ids_are_read_from_their_text() {
        let list: MemberListResponse = serde_json::from_str(
            r#"{"header":{"cluster_id":"1","member_id":"10501334649042878790","raft_term":"2"},
                "members":[{"ID":"10501334649042878790","name":"lucy","peerURLs":["https://10.0.0.1:2380"],
                "clientURLs":["https://10.0.0.1:2379"]},{"ID":"17","peerURLs":["https://10.0.0.3:2380"],
                "isLearner":true}]}"#,
        )
        .unwrap();
        assert_eq!(list.header.member_id, 10501334649042878790);
        assert_eq!(list.members[0].client_urls, ["https://10.0.0.1:2379"]);
        assert!(list.members[1].is_learner && list.members[1].name.is_empty());
        let status: StatusResponse = serde_json::from_str(
            r#"{"header":{"member_id":"17"},"version":"3.6.8","dbSize":"20480","leader":"17",
                "raftIndex":"42","raftTerm":"3","raftAppliedIndex":"41","dbSizeInUse":"16384"}"#,
        )
        .unwrap();
        assert_eq!(
            (status.leader, status.raft_term, status.raft_applied_index),
            (17, 3, 41)
        );
        assert!(status.errors.is_empty());
    }
}
