//! Models a node fetches for its ranks: which part of a model a rank reads ([`Part`]), and
//! where this node's fetch of each part stands ([`FetchState`]). A rank of a Hugging Face model
//! needs only its part's files (its layers' weight files for a pipeline rank, every weight file
//! for a tensor rank), so readiness is per (model, part), not per model.

use placement::{Placement, Sharding};
use std::collections::BTreeMap;

/// The part of a model one rank reads, as far as its files go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// Layers `start..end` of `n_layers` (a pipeline rank; all layers is the whole model).
    Layers {
        /// First layer.
        start: usize,
        /// One past the last layer.
        end: usize,
        /// Layers of the model.
        n_layers: usize,
    },
    /// Slices of every weight (a tensor-parallel rank): every weight file.
    Tensor,
}

impl Part {
    /// The part rank `rank` of `placement` reads of a model of `n_layers` layers.
    pub fn of_rank(placement: &Placement, rank: usize, n_layers: usize) -> Option<Part> {
        let r = placement.ranks.get(rank)?;
        Some(match placement.sharding {
            Sharding::Tensor => Part::Tensor,
            Sharding::Pipeline => Part::Layers {
                start: r.start_layer as usize,
                end: r.end_layer as usize,
                n_layers,
            },
        })
    }

    /// A short name for records and logs: `layers-0-10-of-30`, `tensor`.
    pub fn label(&self) -> String {
        match self {
            Part::Layers {
                start,
                end,
                n_layers,
            } => format!("layers-{start}-{end}-of-{n_layers}"),
            Part::Tensor => "tensor".into(),
        }
    }

    /// The part a [`Part::label`] names, if it names one.
    pub fn parse_label(label: &str) -> Option<Part> {
        if label == "tensor" {
            return Some(Part::Tensor);
        }
        let (range, n_layers) = label.strip_prefix("layers-")?.split_once("-of-")?;
        let (start, end) = range.split_once('-')?;
        Some(Part::Layers {
            start: start.parse().ok()?,
            end: end.parse().ok()?,
            n_layers: n_layers.parse().ok()?,
        })
    }
}

/// Where this node's fetch of one part of a model stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchState {
    /// Fetching.
    Running,
    /// Its files are complete and verified on this node.
    Done,
    /// The fetch failed, for this reason.
    Failed(String),
}

/// Whether (and how far) a model this node lacks can be fetched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Fetch {
    /// Not fetchable: a path, which must be on every node already.
    #[default]
    No,
    /// A Hugging Face model id: fetched per part; the parts this node fetched or is fetching.
    Hub(BTreeMap<Part, FetchState>),
}

impl Fetch {
    /// The state of `part`'s fetch, for a fetchable model.
    pub fn part(&self, part: &Part) -> Option<&FetchState> {
        match self {
            Fetch::No => None,
            Fetch::Hub(parts) => parts.get(part),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_read_their_layers_or_every_weight() {
        let mut p = crate::fixture::record(3, 400_000_000, 3).place().unwrap();
        let parts: Vec<Part> = (0..3).map(|r| Part::of_rank(&p, r, 30).unwrap()).collect();
        assert!(matches!(parts[0], Part::Layers { start: 0, .. }));
        assert!(matches!(
            parts[2],
            Part::Layers {
                end: 30,
                n_layers: 30,
                ..
            }
        ));
        assert_eq!(Part::of_rank(&p, 3, 30), None);
        p.sharding = Sharding::Tensor;
        assert_eq!(Part::of_rank(&p, 1, 30), Some(Part::Tensor));
        assert_eq!(Part::Tensor.label(), "tensor");
        assert_eq!(
            Part::Layers {
                start: 0,
                end: 10,
                n_layers: 30
            }
            .label(),
            "layers-0-10-of-30"
        );
    }
}
