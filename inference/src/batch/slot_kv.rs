//! The KV state of every slot of a batch on one shard, and how a step's sequences are laid out
//! over it.
//!
//! A sequence that decodes (one new position per step, with something cached) joins the
//! shared decode rows ([`KvRows`]), so its attention costs nothing per sequence; a sequence in
//! prefill, or one whose joining would pad the rows past half their real positions
//! ([`KvRows::fits`]), or one with a recurrent layer's state ([`KvCache::is_recurrent`]),
//! keeps its own cache. Inside the layers the rows come first, in row order, then the other sequences in the
//! step's order: [`SlotKv::forward`] permutes the activations into that layout and back, so
//! callers see the step's order only.
//!
//! Which slot is where depends only on the steps seen (their slots and lengths), never on
//! timing or memory: every rank of a distributed instance, following the same plans, lays out
//! every step the same way, which tensor-parallel ranks need (their partial sums are added
//! position by position).

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::kv_rows::{KvRows, StepKv};
use mlx_rs::Array;
use std::collections::BTreeMap;

/// A sequence's slot in a batch (its KV cache), as [`super::BatchForward`] opens and closes it.
/// Defined here, with the slots' caches, so that the forward passes use this file and not the
/// other way round.
pub type Slot = u64;

/// Per-slot KV state of one shard (see the module docs).
pub struct SlotKv {
    layers: usize,
    own: BTreeMap<Slot, KvCache>,
    rows: KvRows,
    /// The slot of each row, in row order; `None` for a row whose sequence left since the
    /// last step (rows are removed together at the next step, one rebuild for all).
    row_slots: Vec<Option<Slot>>,
}

impl SlotKv {
    /// No slots yet, for a shard of `layers` layers.
    pub fn new(layers: usize) -> SlotKv {
        SlotKv {
            layers,
            own: BTreeMap::new(),
            rows: KvRows::default(),
            row_slots: Vec::new(),
        }
    }

    /// Whether `slot` holds a sequence.
    pub fn contains(&self, slot: Slot) -> bool {
        self.own.contains_key(&slot) || self.row_of(slot).is_some()
    }

    /// Slots held.
    pub fn len(&self) -> usize {
        self.own.len() + self.rows()
    }

    /// True with no slots.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sequences decoding in the shared rows now.
    pub fn rows(&self) -> usize {
        self.row_slots.iter().flatten().count()
    }

    fn row_of(&self, slot: Slot) -> Option<usize> {
        self.row_slots.iter().position(|&s| s == Some(slot))
    }

    /// Puts `cache` in `slot` (replacing whatever was there).
    pub fn insert(&mut self, slot: Slot, cache: KvCache) {
        self.close(slot);
        self.own.insert(slot, cache);
    }

    /// Sets (or clears) the M-RoPE image spans of `slot`'s sequence ([`crate::mrope`]), a
    /// slot not seen before starting empty. A sequence with spans decodes on its own cache,
    /// so only a row's clearing is a no-op.
    pub fn set_mrope(
        &mut self,
        slot: Slot,
        spans: Option<std::sync::Arc<crate::mrope::MropeSpans>>,
    ) -> Result<()> {
        if let Some(cache) = self.own.get_mut(&slot) {
            cache.set_mrope(spans);
        } else if spans.is_some() && self.row_of(slot).is_some() {
            return Err(crate::error::InferenceError::InvalidRequest(format!(
                "slot {slot} decodes in the shared rows; image positions need its own cache"
            )));
        } else if spans.is_some() && self.row_of(slot).is_none() {
            // A slot not seen before (a follower's first step of it) starts empty.
            let mut cache = KvCache::new(self.layers);
            cache.set_mrope(spans);
            self.own.insert(slot, cache);
        }
        Ok(())
    }

    /// Frees `slot` (a row is only marked; see `row_slots`).
    pub fn close(&mut self, slot: Slot) {
        self.own.remove(&slot);
        if let Some(row) = self.row_of(slot) {
            self.row_slots[row] = None;
        }
    }

    /// Frees `slot`, handing back its cache.
    pub fn take(&mut self, slot: Slot) -> Result<Option<KvCache>> {
        if let Some(cache) = self.own.remove(&slot) {
            return Ok(Some(cache));
        }
        let Some(row) = self.row_of(slot) else {
            return Ok(None);
        };
        let cache = self.rows.extract(row)?;
        self.row_slots[row] = None;
        Ok(Some(cache))
    }

    /// Frees every slot.
    pub fn clear(&mut self) {
        self.own.clear();
        self.rows = KvRows::default();
        self.row_slots.clear();
    }

    /// Runs `run` (a shard's layers) over one step: `parts` are each sequence's slot and new
    /// positions in the step's order, `h` their activations `[1, total, hidden]` in that
    /// order; a slot not seen before starts empty. Returns `run`'s output in the step's order.
    /// After an error the slots are in an unknown state.
    pub fn forward(
        &mut self,
        parts: &[(Slot, usize)],
        h: Array,
        run: impl FnOnce(Array, &mut [StepKv<'_>]) -> Result<Array>,
    ) -> Result<Array> {
        let distinct: std::collections::BTreeSet<Slot> = parts.iter().map(|p| p.0).collect();
        if distinct.len() != parts.len() {
            return Err(crate::error::InferenceError::InvalidRequest(
                "a step names a slot twice".into(),
            ));
        }
        self.arrange(parts)?;
        // Layout: each row's part in row order, then the others in the step's order.
        let row_of: BTreeMap<Slot, usize> = self
            .row_slots
            .iter()
            .enumerate()
            .filter_map(|(r, s)| s.map(|s| (s, r)))
            .collect();
        let mut order: Vec<usize> = vec![usize::MAX; self.row_slots.len()];
        let mut others = Vec::new();
        for (i, (slot, _)) in parts.iter().enumerate() {
            match row_of.get(slot) {
                Some(&r) => order[r] = i,
                None => others.push(i),
            }
        }
        order.extend(others.iter().copied());
        let h = permute(h, parts, &order, false)?;

        let row_step = if self.rows.is_empty() {
            None
        } else {
            Some(self.rows.begin_step()?)
        };
        let mut taken: Vec<(Slot, usize, KvCache)> = others
            .iter()
            .map(|&i| {
                let (slot, len) = parts[i];
                let cache = self
                    .own
                    .remove(&slot)
                    .unwrap_or_else(|| KvCache::new(self.layers));
                (slot, len, cache)
            })
            .collect();
        let result = {
            let mut segments: Vec<StepKv<'_>> = Vec::with_capacity(taken.len() + 1);
            if let Some(step) = &row_step {
                segments.push(StepKv::Rows(&mut self.rows, step));
            }
            segments.extend(
                taken
                    .iter_mut()
                    .map(|(_, len, cache)| StepKv::Own(*len, cache)),
            );
            run(h, &mut segments)
        };
        self.own
            .extend(taken.into_iter().map(|(slot, _, cache)| (slot, cache)));
        let out = result?;
        if row_step.is_some() {
            self.rows.end_step();
        }
        permute(out, parts, &order, true)
    }

    /// Moves slots between own caches and the rows for a step of `parts`: rows that left
    /// and rows with no one-position part leave them (the latter keep their cache as their
    /// own); sequences with a one-position part and something cached join them while the
    /// padding allows, in the step's order.
    fn arrange(&mut self, parts: &[(Slot, usize)]) -> Result<()> {
        let decoding: BTreeMap<Slot, bool> = parts.iter().map(|&(s, len)| (s, len == 1)).collect();
        let mut leaving = Vec::new();
        for (r, slot) in self.row_slots.iter().enumerate() {
            match slot {
                None => leaving.push(r),
                Some(s) if decoding.get(s) != Some(&true) => {
                    self.own.insert(*s, self.rows.extract(r)?);
                    leaving.push(r);
                }
                Some(_) => {}
            }
        }
        if !leaving.is_empty() {
            self.rows.remove(&leaving)?;
            let mut r = 0;
            self.row_slots.retain(|_| {
                r += 1;
                !leaving.contains(&(r - 1))
            });
        }
        let mut joining = Vec::new();
        let mut lens = Vec::new();
        for &(slot, len) in parts {
            let Some(cache) = self.own.get(&slot) else {
                continue;
            };
            // A recurrent layer's state is not keys and values, and a layer without attention
            // keeps nothing: such a sequence decodes on its own cache (each one alone, exactly
            // as it would outside a batch).
            if len != 1 || cache.is_empty() || cache.decodes_alone() || joining.contains(&slot) {
                continue;
            }
            lens.push(cache.len());
            if !self.rows.fits(&lens) {
                lens.pop();
                continue;
            }
            joining.push(slot);
        }
        if !joining.is_empty() {
            let caches: Vec<KvCache> = joining.iter().filter_map(|s| self.own.remove(s)).collect();
            self.rows.join(caches)?;
            self.row_slots.extend(joining.into_iter().map(Some));
        }
        Ok(())
    }
}

/// `h` (`[1, total, hidden]`, parts in the step's order) laid out in `order` (the step's part
/// indices in layout order), or back again when `back`.
fn permute(h: Array, parts: &[(Slot, usize)], order: &[usize], back: bool) -> Result<Array> {
    if order.iter().enumerate().all(|(at, &i)| at == i) {
        return Ok(h);
    }
    let mut starts = Vec::with_capacity(parts.len());
    let mut at = 0i32;
    for &(_, len) in parts {
        starts.push(at);
        at += len as i32;
    }
    // Layout position -> step position.
    let mut gather: Vec<i32> = Vec::with_capacity(at as usize);
    for &i in order {
        gather.extend(starts[i]..starts[i] + parts[i].1 as i32);
    }
    let index = if back {
        let mut inverse = vec![0i32; gather.len()];
        for (layout, &step) in gather.iter().enumerate() {
            inverse[step as usize] = layout as i32;
        }
        inverse
    } else {
        gather
    };
    let n = index.len() as i32;
    Ok(h.take_axis(Array::from_slice(&index, &[n]), 1)?)
}

#[cfg(test)]
mod tests;
