//! Record signatures in a real node: ed25519 with the node's iroh secret key, checked against
//! the author's node id (its public key).

use crate::proto::id::NodeId;
use crate::proto::record::{Authority, Signature};
use iroh::{PublicKey, SecretKey};

/// Signs with the node's iroh secret key (ed25519) and checks other nodes' signatures with
/// their node id, which is their public key.
pub(crate) struct IrohAuthority {
    pub(crate) key: SecretKey,
}

impl Authority for IrohAuthority {
    fn sign(&self, message: &[u8]) -> Signature {
        self.key.sign(message).to_bytes().to_vec()
    }

    fn verify(&self, author: &NodeId, message: &[u8], signature: &[u8]) -> bool {
        let Ok(key) = PublicKey::from_bytes(author.as_bytes()) else {
            return false;
        };
        let Ok(bytes) = <[u8; 64]>::try_from(signature) else {
            return false;
        };
        key.verify(message, &iroh::Signature::from_bytes(&bytes))
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iroh_signatures_bind_records_to_their_author() {
        let a = SecretKey::generate();
        let b = SecretKey::generate();
        let auth = IrohAuthority { key: a.clone() };
        let id_a = NodeId::from_bytes(*a.public().as_bytes());
        let id_b = NodeId::from_bytes(*b.public().as_bytes());
        let sig = auth.sign(b"record");
        assert_eq!(sig.len(), 64);
        assert!(auth.verify(&id_a, b"record", &sig));
        assert!(!auth.verify(&id_b, b"record", &sig));
        assert!(!auth.verify(&id_a, b"other", &sig));
        assert!(!auth.verify(&id_a, b"record", &sig[..10]));
    }
}
