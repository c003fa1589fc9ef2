//! The operands of the quantized-product tests (`cpu_qmm.rs`, `cpu_qmm_int8.rs`): seeded
//! random weights in MLX's affine layout, read back independently, and an f64 reference.

use inference::quantized::{QuantMode, QuantSpec};
use mlx_rs::{Array, Dtype};

/// A small deterministic generator (xorshift), so each case is reproducible from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

pub struct Case {
    pub x: Vec<f32>,
    pub words: Vec<u32>,
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub group: usize,
    pub bits: usize,
}

impl Case {
    pub fn new(seed: u64, m: usize, n: usize, k: usize, group: usize, bits: usize) -> Case {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let words = (0..n * k * bits / 32).map(|_| rng.next() as u32).collect();
        let scales = (0..n * k / group).map(|_| rng.uniform() * 0.05).collect();
        let biases = (0..n * k / group).map(|_| rng.uniform() * 0.2).collect();
        let x = (0..m * k).map(|_| rng.uniform()).collect();
        Case {
            x,
            words,
            scales,
            biases,
            m,
            n,
            k,
            group,
            bits,
        }
    }

    /// Element `(r, c)` of the weights, as MLX's affine layout defines it: each row a
    /// little-endian bit stream, value `c` in bits `bits * c ..` (read here bit by bit).
    pub fn weight(&self, r: usize, c: usize) -> f64 {
        let row = r * self.k * self.bits / 32;
        let q: u32 = (0..self.bits)
            .map(|b| {
                let bit = c * self.bits + b;
                ((self.words[row + bit / 32] >> (bit % 32)) & 1) << b
            })
            .sum();
        let g = r * self.k / self.group + c / self.group;
        // The scales and biases as the kernel reads them (rounded to their dtype by the caller).
        self.scales[g] as f64 * q as f64 + self.biases[g] as f64
    }

    pub fn reference(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.m * self.n];
        for i in 0..self.m {
            for r in 0..self.n {
                out[i * self.n + r] = (0..self.k)
                    .map(|c| self.x[i * self.k + c] as f64 * self.weight(r, c))
                    .sum();
            }
        }
        out
    }

    pub fn spec(&self) -> QuantSpec {
        QuantSpec {
            group_size: self.group as i32,
            bits: self.bits as i32,
            mode: QuantMode::Affine,
        }
    }

    /// The operands as MLX arrays, scales and biases in `dtype` (and the case's own values
    /// rounded the same way, so the reference sees what the kernel sees).
    pub fn arrays(&mut self, dtype: Dtype) -> (Array, Array, Array, Array) {
        let groups = (self.n as i32, (self.k / self.group) as i32);
        let round = |v: &[f32]| -> (Array, Vec<f32>) {
            let a = Array::from_slice(v, &[groups.0, groups.1])
                .as_dtype(dtype)
                .unwrap();
            let back = a.as_dtype(Dtype::Float32).unwrap();
            back.eval().unwrap();
            (a, back.as_slice::<f32>().to_vec())
        };
        let (scales, s) = round(&self.scales);
        let (biases, b) = round(&self.biases);
        self.scales = s;
        self.biases = b;
        let x = Array::from_slice(&self.x, &[self.m as i32, self.k as i32]);
        let w = Array::from_slice(
            &self.words,
            &[self.n as i32, (self.k * self.bits / 32) as i32],
        );
        (x, w, scales, biases)
    }
}

pub fn host(a: &Array) -> Vec<f32> {
    let a = a.as_dtype(Dtype::Float32).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().to_vec()
}

/// The worst difference from the reference, relative to the size of the terms summed.
pub fn worst(case: &Case, got: &[f32]) -> f64 {
    let want = case.reference();
    assert_eq!(got.len(), want.len());
    let scale = (case.k as f64).sqrt() * 0.5;
    want.iter()
        .zip(got)
        .map(|(w, &g)| (w - g as f64).abs() / scale.max(1.0))
        .fold(0.0, f64::max)
}

pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
