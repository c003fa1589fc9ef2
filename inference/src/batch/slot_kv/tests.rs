//! Whatever steps come (sequences joining, decoding, prefilling again, leaving, taken for a
//! prompt cache), every slot's cache holds exactly the positions written for it, in order, and
//! a step's output comes back in the step's order.

use super::*;
use crate::kv_rows::tests::held;
use crate::kv_rows::LayerKv;
use mlx_rs::ops::indexing::IndexOp;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// What one slot does in a step.
#[derive(Debug, Clone, Copy)]
enum Act {
    Absent,
    /// New positions in the step (1: decoding).
    Run(usize),
    /// Leaves, its cache taken (as for a prompt cache).
    Take,
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        2 => Just(Act::Absent),
        5 => Just(Act::Run(1)),
        1 => (2usize..4).prop_map(Act::Run),
        1 => Just(Act::Take),
    ]
}

fn value(slot: Slot, position: usize) -> f32 {
    (slot * 1000) as f32 + position as f32
}

/// Writes each position's value (carried in `h`) as its key and value.
fn write_values(h: Array, segments: &mut [StepKv<'_>]) -> Result<Array> {
    let mut at = 0i32;
    for segment in segments.iter_mut() {
        let n = segment.positions() as i32;
        let part = h.index((.., at..at + n, ..));
        match segment.layer(0) {
            LayerKv::Own(_, cache) => {
                let k = part.reshape(&[1, 1, n, 1])?;
                cache.append(k.clone(), k)?;
            }
            LayerKv::Rows(layer, step) => {
                let k = part.reshape(&[n, 1, 1, 1])?;
                layer.write(&k, &k, step)?;
            }
        }
        at += n;
    }
    Ok(h)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn every_slot_holds_what_was_written_for_it(
        steps in prop::collection::vec(prop::collection::vec(act(), 5), 1..24)
    ) {
        let mut kv = SlotKv::new(1);
        let mut expected: BTreeMap<Slot, Vec<f32>> = BTreeMap::new();
        for step in &steps {
            let mut parts = Vec::new();
            let mut values = Vec::new();
            for (slot, a) in step.iter().enumerate() {
                let slot = slot as Slot;
                match *a {
                    Act::Absent => {}
                    Act::Take => {
                        let cache = kv.take(slot).unwrap();
                        let want = expected.remove(&slot);
                        prop_assert_eq!(cache.as_ref().map(held), want);
                    }
                    Act::Run(n) => {
                        let seq = expected.entry(slot).or_default();
                        for _ in 0..n {
                            let v = value(slot, seq.len());
                            seq.push(v);
                            values.push(v);
                        }
                        parts.push((slot, n));
                    }
                }
            }
            if parts.is_empty() {
                continue;
            }
            let n = values.len() as i32;
            let h = Array::from_slice(&values, &[1, n, 1]);
            let out = kv.forward(&parts, h, write_values).unwrap();
            out.eval().unwrap();
            prop_assert_eq!(out.as_slice::<f32>(), &values[..]);
            prop_assert_eq!(kv.len(), expected.len());
        }
        for (slot, want) in expected {
            let cache = kv.take(slot).unwrap().expect("an open slot");
            prop_assert_eq!(held(&cache), want);
        }
        prop_assert!(kv.is_empty());
    }
}

#[test]
fn a_step_naming_a_slot_twice_is_refused() {
    let mut kv = SlotKv::new(1);
    let h = Array::from_slice(&[1.0f32, 2.0], &[1, 2, 1]);
    assert!(kv.forward(&[(0, 1), (0, 1)], h, write_values).is_err());
}

#[test]
fn decoding_sequences_share_the_rows() {
    let mut kv = SlotKv::new(1);
    let h = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[1, 4, 1]);
    kv.forward(&[(0, 2), (1, 2)], h, write_values).unwrap();
    assert_eq!(kv.rows(), 0);
    let h = Array::from_slice(&[5.0f32, 6.0], &[1, 2, 1]);
    kv.forward(&[(0, 1), (1, 1)], h, write_values).unwrap();
    assert_eq!(kv.rows(), 2);
    assert_eq!(held(&kv.take(1).unwrap().unwrap()), [3.0, 4.0, 6.0]);
    assert_eq!(kv.rows(), 1);
}
