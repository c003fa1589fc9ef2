//! [`Cluster`]: what a node's models need from the rest of the node: its id, the replicated
//! state, writes of its own records (download progress, the files it holds), and connections
//! to members on the file-copy ALPN. The node's context (the mesh, or a lone test node)
//! supplies it.

use control::Snapshot;
use gateway::BoxFuture;
use serde_json::Value;

/// The node as its models see it (see the module docs).
pub trait Cluster: Send + Sync + 'static {
    /// This node's id (`GET /node_id`).
    fn node_id(&self) -> String;
    /// The replicated state now, with this node's liveness view.
    fn snapshot(&self) -> Snapshot;
    /// Writes this node's record `key`.
    fn write(&self, key: &str, value: &Value) -> Result<(), String>;
    /// Deletes this node's record `key`; true if it existed.
    fn remove(&self, key: &str) -> bool;
    /// A connection to member `node` on the file-copy ALPN ([`crate::peer`]); a node
    /// outside a mesh has none.
    fn open_files(
        &self,
        node: String,
    ) -> BoxFuture<'_, Result<iroh::endpoint::Connection, String>> {
        Box::pin(async move { Err(format!("no mesh to reach node {node} through")) })
    }
}
