//! Verified links between nodes: an IP one node reached another at, or an RDMA link.

use crate::node::NodeId;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::net::IpAddr;

/// A directed, verified link `from → to`. For an IP link, `from` called `GET /node_id` at
/// `ip` (one of `to`'s addresses) and `to` answered with its own id. For an RDMA link, `from`'s
/// local RDMA interface reaches `to` (`to_iface` is the interface on `to`'s side).
///
/// JSON: `{"from", "to", "ip"}` or `{"from", "to", "rdma": {"from_iface", "to_iface"}}`,
/// exactly one of `ip` and `rdma`.
///
/// Binary formats (postcard, for the replicated state) get the plain struct with `link` as an
/// enum instead, since they cannot skip absent fields.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Edge {
    /// The node that verified the link.
    pub from: NodeId,
    /// The node it reached.
    pub to: NodeId,
    /// How it reached it.
    pub link: Link,
}

/// The medium of an [`Edge`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Link {
    /// `to` answered at this IP address (one of its own interfaces).
    Ip(IpAddr),
    /// An RDMA link between two local interfaces.
    Rdma(RdmaLink),
}

/// The two ends of an RDMA link, by interface name (`rdma_en2`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(deny_unknown_fields)]
pub struct RdmaLink {
    /// The RDMA interface on the `from` node.
    pub from_iface: String,
    /// The RDMA interface on the `to` node.
    pub to_iface: String,
}

/// The JSON shape of an edge, checked into an [`Edge`] (one of `ip` or `rdma`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EdgeRecord {
    from: NodeId,
    to: NodeId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rdma: Option<RdmaLink>,
}

impl TryFrom<EdgeRecord> for Edge {
    type Error = String;

    fn try_from(record: EdgeRecord) -> Result<Self, Self::Error> {
        let link = match (record.ip, record.rdma) {
            (Some(ip), None) => Link::Ip(ip),
            (None, Some(rdma)) => Link::Rdma(rdma),
            (Some(_), Some(_)) => {
                return Err("an edge has either `ip` or `rdma`, not both; split it in two".into())
            }
            (None, None) => {
                return Err("an edge needs `ip` (an IP link) or `rdma` (an RDMA link)".into())
            }
        };
        Ok(Edge {
            from: record.from,
            to: record.to,
            link,
        })
    }
}

impl From<Edge> for EdgeRecord {
    fn from(edge: Edge) -> Self {
        let (ip, rdma) = match edge.link {
            Link::Ip(ip) => (Some(ip), None),
            Link::Rdma(rdma) => (None, Some(rdma)),
        };
        EdgeRecord {
            from: edge.from,
            to: edge.to,
            ip,
            rdma,
        }
    }
}

/// The binary shape of an edge.
#[derive(Serialize, Deserialize)]
struct EdgeBinary {
    from: NodeId,
    to: NodeId,
    link: Link,
}

impl Serialize for Edge {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            EdgeRecord::from(self.clone()).serialize(serializer)
        } else {
            EdgeBinary {
                from: self.from.clone(),
                to: self.to.clone(),
                link: self.link.clone(),
            }
            .serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for Edge {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let record = EdgeRecord::deserialize(deserializer)?;
            Edge::try_from(record).map_err(serde::de::Error::custom)
        } else {
            let EdgeBinary { from, to, link } = EdgeBinary::deserialize(deserializer)?;
            Ok(Edge { from, to, link })
        }
    }
}
