//! The rows' bookkeeping: what goes in comes out at the same positions, the mask and RoPE
//! positions follow each row's start, and padding stays within its bound.

use super::*;
use crate::kv_cache::held_bound;

/// A one-layer cache of `values` (one key/value head of width 1), as a sequence's own.
fn own(values: &[f32]) -> KvCache {
    let mut cache = KvCache::new(1);
    let n = values.len() as i32;
    let a = Array::from_slice(values, &[1, 1, n, 1]);
    cache.layers[0].append(a.clone(), a).unwrap();
    cache
}

/// The positions a cache holds, as written (empty for a cache nothing was written to).
pub(crate) fn held(cache: &KvCache) -> Vec<f32> {
    let Some((keys, _)) = cache.layers[0].buffers() else {
        return Vec::new();
    };
    let n = cache.len() as i32;
    let k = keys
        .index((0..1, .., 0..n, ..))
        .flatten(None, None)
        .unwrap();
    k.eval().unwrap();
    k.as_slice::<f32>().to_vec()
}

#[test]
fn rows_keep_each_sequence_right_aligned_and_give_it_back_whole() {
    let mut rows = KvRows::default();
    rows.join(vec![
        own(&[1.0, 2.0, 3.0]),
        own(&[10.0, 11.0, 12.0, 13.0, 14.0]),
    ])
    .unwrap();
    assert_eq!((rows.rows(), rows.len_of(0), rows.len_of(1)), (2, 3, 5));
    assert_eq!(held(&rows.extract(0).unwrap()), [1.0, 2.0, 3.0]);
    assert_eq!(
        held(&rows.extract(1).unwrap()),
        [10.0, 11.0, 12.0, 13.0, 14.0]
    );

    let step = rows.begin_step().unwrap();
    step.positions.eval().unwrap();
    assert_eq!(step.positions.as_slice::<i32>(), [3, 5]);
    let mask = step.mask.as_ref().expect("row 0 is padded");
    mask.eval().unwrap();
    assert_eq!(mask.shape(), [2, 1, 1, 6]);
    assert_eq!(
        mask.as_slice::<bool>(),
        [false, false, true, true, true, true, true, true, true, true, true, true]
    );
    let new = Array::from_slice(&[4.0f32, 15.0], &[2, 1, 1, 1]);
    rows.layers[0].write(&new, &new, &step).unwrap();
    rows.end_step();
    assert_eq!(held(&rows.extract(0).unwrap()), [1.0, 2.0, 3.0, 4.0]);

    // Rows of one length need no mask.
    let mut even = KvRows::default();
    even.join(vec![own(&[1.0, 2.0]), own(&[3.0, 4.0])]).unwrap();
    assert!(even.begin_step().unwrap().mask.is_none());

    // A longer sequence joining shifts the others right.
    rows.join(vec![own(&[20.0; 9])]).unwrap();
    assert_eq!((rows.len_of(0), rows.len_of(1), rows.len_of(2)), (4, 6, 9));
    assert_eq!(
        held(&rows.extract(1).unwrap()),
        [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    );

    // Leaving cuts the padding every remaining row shares.
    rows.remove(&[2]).unwrap();
    assert_eq!((rows.rows(), rows.end), (2, 6));
    assert_eq!(rows.starts, [2, 0]);
    assert_eq!(held(&rows.extract(0).unwrap()), [1.0, 2.0, 3.0, 4.0]);
    rows.remove(&[1, 0]).unwrap();
    assert!(rows.is_empty());
}

#[test]
fn joining_is_refused_past_half_the_real_positions_of_padding() {
    let mut rows = KvRows::default();
    rows.join(vec![own(&vec![0.0; 100])]).unwrap();
    // Padding 10 + 20 for 270 real positions: within half of them.
    assert!(rows.fits(&[90, 80]));
    // A sequence of 10 beside one of 100: padding 90 > (110 + 2 * 16) / 2.
    assert!(!rows.fits(&[10]));
    // Within the slack, whatever the lengths.
    assert!(rows.fits(&[85]));
    assert!(KvRows::default().fits(&[4000]));
}

#[test]
fn an_empty_cache_cannot_join() {
    let mut rows = KvRows::default();
    assert!(rows.join(vec![KvCache::new(1)]).is_err());
    assert!(rows.is_empty());
}

/// A one-layer cache of a sliding layer of `window` whose position `p` holds `base + p`,
/// `len` positions long, appended one by one (so it has forgotten its oldest).
fn sliding(base: f32, len: usize, window: usize) -> KvCache {
    let mut cache = KvCache::new(1);
    for p in 0..len {
        let a = Array::from_slice(&[base + p as f32], &[1, 1, 1, 1]);
        cache.layers[0]
            .append_within(a.clone(), a, Some(window))
            .unwrap();
    }
    cache
}

/// The positions a sliding cache still holds, with the first one's index.
fn held_sliding(cache: &KvCache) -> (usize, Vec<f32>) {
    let layer = &cache.layers[0];
    let (keys, _) = layer.buffers().unwrap();
    let k = keys
        .index((0..1, .., 0..layer.held() as i32, ..))
        .flatten(None, None)
        .unwrap();
    k.eval().unwrap();
    (layer.dropped(), k.as_slice::<f32>().to_vec())
}

#[test]
fn sliding_rows_forget_what_no_row_sees_and_give_back_what_each_needs() {
    let w = 6;
    let mut rows = KvRows::default();
    rows.join(vec![sliding(0.0, 20, w), sliding(1000.0, 3, w)])
        .unwrap();
    let mut lens = [20usize, 3];
    for step in 0..40 {
        if step == 10 {
            // A third joins midway, longer than both.
            rows.join(vec![sliding(2000.0, 40, w)]).unwrap();
        }
        let s = rows.begin_step().unwrap();
        let n = rows.rows();
        let values: Vec<f32> = (0..n)
            .map(|r| [0.0, 1000.0, 2000.0][r] + rows.len_of(r) as f32)
            .collect();
        let new = Array::from_slice(&values, &[n as i32, 1, 1, 1]);
        let (k, _, first) = rows.layers[0].write(&new, &new, &s).unwrap();
        rows.end_step();
        // Each row's last `w` columns (those its query sees) hold its last `w` positions.
        k.eval().unwrap();
        let held = k.shape()[2] as usize;
        assert!(
            held <= held_bound(w) + 1,
            "step {step}: {held} columns held"
        );
        assert!(first + held == rows.end && rows.end - first >= w.min(rows.end));
        let all = k.flatten(None, None).unwrap();
        all.eval().unwrap();
        let all = all.as_slice::<f32>();
        for r in 0..n {
            let len = rows.len_of(r);
            let base = [0.0, 1000.0, 2000.0][r];
            for back in 1..=w.min(len) {
                assert_eq!(
                    all[r * held + held - back],
                    base + (len - back) as f32,
                    "step {step}, row {r}, {back} back"
                );
            }
        }
        if step < 10 {
            lens = [lens[0] + 1, lens[1] + 1];
        }
    }
    assert_eq!(lens, [30, 13]);
    // Taken out, a row is a sequence's own cache holding what its next query needs.
    for r in 0..rows.rows() {
        let own = rows.extract(r).unwrap();
        let (from, held) = held_sliding(&own);
        let len = rows.len_of(r);
        assert_eq!(own.len(), len);
        assert!(from + w - 1 <= len && from + held.len() == len);
        let base = [0.0, 1000.0, 2000.0][r];
        let want: Vec<f32> = (from..len).map(|p| base + p as f32).collect();
        assert_eq!(held, want, "row {r}");
    }
    // Rows leaving cut the padding; the others keep their windows.
    rows.remove(&[2]).unwrap();
    let (from, held) = held_sliding(&rows.extract(1).unwrap());
    let len = rows.len_of(1);
    assert_eq!(held.last(), Some(&(1000.0 + (len - 1) as f32)));
    assert!(from + w - 1 <= len);
}
