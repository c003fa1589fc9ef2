//! The rows' bookkeeping: what goes in comes out at the same positions, the mask and RoPE
//! positions follow each row's start, and padding stays within its bound.

use super::*;

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
