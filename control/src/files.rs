//! The records of models' files in the replicated state, each written by the node whose files
//! they describe (typed here, next to [`crate::RunnerRecord`], so that the node that writes
//! them and every node that reads them share one shape and no reader parses them by hand):
//!
//! - `download/<model>/<part>` ([`DownloadKey`]) → [`DownloadRecord`]: where the author's
//!   download of one part of a model stands, and which files it still wants (the nodes that
//!   want a file agree from these on which of them asks the hub for it).
//! - `files/<repo>` ([`Holding::key`]) → [`Holding`]: the verified files of a model the author
//!   holds, so that other members copy them from it.
//!
//! Records are exchanged between nodes of one version; the JSON field names are also what
//! `GET /state`, the dashboard and `shoal status` show.

use crate::fetch::Part;
use crate::snapshot::Author;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Key prefix of download records.
pub const DOWNLOAD_PREFIX: &str = "download/";
/// Key prefix of holding records (`files/<repo>`).
pub const FILES_PREFIX: &str = "files/";
/// The part label of a download of a model's support files alone (configuration, tokenizer,
/// template, index), which the node placing a model fetches first.
pub const SUPPORT_PART: &str = "support";

/// The key of a download record: `download/<model>/<part label>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DownloadKey {
    /// The model reference (`org/name`, `org/name@revision`, `org/name:QUANT`).
    pub model: String,
    /// The part downloaded; `None` for the support files alone.
    pub part: Option<Part>,
}

impl DownloadKey {
    /// The key of `part` of `model` (`None`: its support files).
    pub fn new(model: &str, part: Option<Part>) -> DownloadKey {
        DownloadKey {
            model: model.to_string(),
            part,
        }
    }

    /// The part's label as records and logs show it: `layers-0-10-of-30`, `tensor`, `support`.
    pub fn label(&self) -> String {
        self.part
            .map_or_else(|| SUPPORT_PART.to_string(), |p| p.label())
    }

    /// The prefix every download record of `model` starts with: `download/<model>/`.
    pub fn prefix(model: &str) -> String {
        format!("{DOWNLOAD_PREFIX}{model}/")
    }

    /// The key `key` names, if it is a download record's with a part label this version knows.
    pub fn parse(key: &str) -> Option<DownloadKey> {
        let (model, label) = key.strip_prefix(DOWNLOAD_PREFIX)?.rsplit_once('/')?;
        let part = match label {
            SUPPORT_PART => None,
            label => Some(Part::parse_label(label)?),
        };
        Some(DownloadKey::new(model, part))
    }
}

impl fmt::Display for DownloadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", DownloadKey::prefix(&self.model), self.label())
    }
}

/// Where a download stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum DownloadState {
    /// Files are being fetched.
    #[default]
    Downloading,
    /// Every file of the part is on the author's disk, verified.
    Complete,
    /// It ended with [`DownloadRecord::error`].
    Failed,
}

impl DownloadState {
    /// The state as the record spells it: `downloading`, `complete`, `failed`.
    pub fn name(self) -> &'static str {
        match self {
            DownloadState::Downloading => "downloading",
            DownloadState::Complete => "complete",
            DownloadState::Failed => "failed",
        }
    }
}

/// The `download/<model>/<part>` record: the author's download of one part of a model. Fields
/// a record leaves out read as their defaults (a record written by hand in a test, a state
/// read back from `GET /state`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(default)]
pub struct DownloadRecord {
    /// The model reference.
    pub model: String,
    /// The part's label ([`DownloadKey::label`]).
    pub part: String,
    /// Where it stands.
    pub state: DownloadState,
    /// Bytes held over all its files.
    pub done: u64,
    /// Bytes of all its files.
    pub total: u64,
    /// Bytes that came over the network (what was already held not counted).
    pub fetched: u64,
    /// Files complete.
    pub files_complete: usize,
    /// Files in all.
    pub files: usize,
    /// A file being fetched now, if any.
    pub file: Option<String>,
    /// Where that file comes from: the hub's endpoint or a member's node id.
    pub from: String,
    /// Hub content hashes of the files it still wants, while downloading.
    pub wants: Vec<String>,
    /// Bytes fetched per second since it started.
    pub rate_bytes_per_s: f64,
    /// Seconds left at that rate, once something came.
    pub eta_s: Option<f64>,
    /// How long the last set of files took to arrive, from the end of the settle wait to the
    /// last file verified (what `cargo xtask bench peer-copy` reads).
    pub transfer_s: Option<f64>,
    /// Why it failed, once failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl DownloadRecord {
    /// Whether it is downloading and still wants the file with content hash `hash`.
    pub fn wants(&self, hash: &str) -> bool {
        self.state == DownloadState::Downloading && self.wants.iter().any(|h| h == hash)
    }
}

/// The `files/<repo>` record: the verified files of one model the author holds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct Holding {
    /// The revision the files are of (`main`, a tag, a commit).
    pub revision: String,
    /// The commit it pointed to.
    pub commit: String,
    /// The files, by path.
    pub files: Vec<HeldFile>,
}

impl Holding {
    /// The key of the holding record of repository `repo` (`org/name`): `files/<repo>`.
    pub fn key(repo: &str) -> String {
        format!("{FILES_PREFIX}{repo}")
    }
}

/// One held file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HeldFile {
    /// Path in the repository.
    pub path: String,
    /// Size.
    pub size: u64,
    /// The hub's content hash (the blob's name).
    pub hash: String,
}

impl Author {
    /// The author's download records of `model`, decoded; undecodable ones are skipped.
    pub fn downloads<'a>(
        &'a self,
        model: &str,
    ) -> impl Iterator<Item = (DownloadKey, DownloadRecord)> + 'a {
        let prefix = DownloadKey::prefix(model);
        self.records
            .range(prefix.clone()..)
            .take_while(move |(k, _)| k.starts_with(&prefix))
            .filter_map(|(k, v)| Some((DownloadKey::parse(k)?, serde_json::from_str(v).ok()?)))
    }

    /// The author's download record of one rank's files of `model`: the tensor part for a
    /// tensor-parallel rank, the part of exactly `layers` (start, end) for a pipeline rank.
    pub fn rank_download(
        &self,
        model: &str,
        sharding: placement::Sharding,
        (start, end): (u32, u32),
    ) -> Option<DownloadRecord> {
        let wanted = |part: Option<Part>| match (sharding, part) {
            (placement::Sharding::Tensor, Some(Part::Tensor)) => true,
            (
                placement::Sharding::Pipeline,
                Some(Part::Layers {
                    start: s, end: e, ..
                }),
            ) => (s, e) == (start as usize, end as usize),
            _ => false,
        };
        self.downloads(model)
            .find(|(key, _)| wanted(key.part))
            .map(|(_, record)| record)
    }

    /// The author's holding record of repository `repo`, if it has a readable one.
    pub fn holding(&self, repo: &str) -> Option<Holding> {
        serde_json::from_str(self.records.get(&Holding::key(repo))?).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_as_themselves() {
        let layers = Part::Layers {
            start: 0,
            end: 15,
            n_layers: 30,
        };
        for (key, text) in [
            (
                DownloadKey::new("org/m", Some(layers)),
                "download/org/m/layers-0-15-of-30",
            ),
            (
                DownloadKey::new("org/m:Q4_K_M", Some(Part::Tensor)),
                "download/org/m:Q4_K_M/tensor",
            ),
            (
                DownloadKey::new("org/m@v2", None),
                "download/org/m@v2/support",
            ),
        ] {
            assert_eq!(key.to_string(), text);
            assert_eq!(DownloadKey::parse(text), Some(key));
        }
        assert_eq!(DownloadKey::parse("download/org/m/shards"), None);
        assert_eq!(DownloadKey::parse("files/org/m"), None);
    }

    #[test]
    fn a_record_keeps_its_field_names_and_reads_partial_records() {
        let record = DownloadRecord {
            model: "org/m".into(),
            part: "tensor".into(),
            wants: vec!["22".into()],
            ..DownloadRecord::default()
        };
        let value = serde_json::to_value(&record).unwrap();
        assert_eq!(value["state"], "downloading");
        assert_eq!(value["eta_s"], serde_json::Value::Null);
        assert!(value.get("error").is_none(), "{value}");
        assert!(record.wants("22") && !record.wants("33"));
        let partial: DownloadRecord =
            serde_json::from_str(r#"{"state": "failed", "error": "gated"}"#).unwrap();
        assert_eq!(partial.state, DownloadState::Failed);
        assert_eq!(partial.error.as_deref(), Some("gated"));
        assert!(!partial.wants("22"));
    }

    #[test]
    fn a_rank_finds_the_record_of_its_own_part() {
        use placement::Sharding::{Pipeline, Tensor};
        let layers = |start, end| Part::Layers {
            start,
            end,
            n_layers: 30,
        };
        let record = |part: &str| DownloadRecord {
            model: "org/m".into(),
            part: part.into(),
            ..DownloadRecord::default()
        };
        let mut author = Author::default();
        for (part, name) in [
            (Some(layers(0, 15)), "layers-0-15-of-30"),
            (Some(Part::Tensor), "tensor"),
            (None, "support"),
        ] {
            author.records.insert(
                DownloadKey::new("org/m", part).to_string(),
                serde_json::to_string(&record(name)).unwrap(),
            );
        }
        let part = |sharding, layers| author.rank_download("org/m", sharding, layers);
        // (sharding, rank's layers, the record's part or none)
        let cases = [
            (Pipeline, (0, 15), Some("layers-0-15-of-30")),
            (Pipeline, (15, 30), None),
            (Pipeline, (0, 30), None),
            (Tensor, (0, 30), Some("tensor")),
        ];
        for (sharding, rank, expected) in cases {
            let found = part(sharding, rank).map(|r| r.part);
            assert_eq!(found.as_deref(), expected, "{sharding:?} {rank:?}");
        }
        assert!(author.rank_download("org/other", Tensor, (0, 30)).is_none());
    }
}
