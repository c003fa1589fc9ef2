//! MLX computes through mlx-rs on this platform: values, half-precision types and BLAS.

use half::{bf16, f16};
use mlx_rs::{ops, Array, Dtype};

#[test]
fn matmul_has_the_known_result() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = Array::from_slice(&[7.0f32, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2]);
    let c = ops::matmul(&a, &b).unwrap();
    c.eval().unwrap();
    assert_eq!(c.shape(), &[2, 2]);
    assert_eq!(c.as_slice::<f32>(), &[58.0, 64.0, 139.0, 154.0]);
}

#[test]
fn large_matmul_agrees_with_a_plain_loop() {
    // Big enough that MLX hands it to BLAS (sgemm).
    let n = 128usize;
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let c = ops::matmul(
        Array::from_slice(&a, &[n as i32, n as i32]),
        Array::from_slice(&b, &[n as i32, n as i32]),
    )
    .unwrap();
    c.eval().unwrap();
    let got = c.as_slice::<f32>();
    for (row, col) in [(0, 0), (5, 77), (127, 127), (64, 3)] {
        let want: f32 = (0..n).map(|k| a[row * n + k] * b[k * n + col]).sum();
        assert_eq!(got[row * n + col], want, "element ({row}, {col})");
    }
}

#[test]
fn f16_and_bf16_round_trip() {
    let values = [0.5f32, -2.0, 1024.0, 0.0];
    let halves: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
    let arr = Array::from_slice(&halves, &[4]);
    assert_eq!(arr.dtype(), Dtype::Float16);
    let doubled =
        ops::multiply(&arr, Array::from_f32(2.0).as_dtype(Dtype::Float16).unwrap()).unwrap();
    doubled.eval().unwrap();
    let got: Vec<f32> = doubled
        .as_slice::<f16>()
        .iter()
        .map(|h| h.to_f32())
        .collect();
    assert_eq!(got, vec![1.0, -4.0, 2048.0, 0.0]);
    let scalar = Array::from_slice(&[f16::from_f32(0.25)], &[1]);
    assert_eq!(scalar.item_exact::<f16>(), f16::from_f32(0.25)); // the scalar (item) path

    let brains: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
    let arr = Array::from_slice(&brains, &[4]);
    assert_eq!(arr.dtype(), Dtype::Bfloat16);
    let as_f32 = arr.as_dtype(Dtype::Float32).unwrap();
    as_f32.eval().unwrap();
    assert_eq!(as_f32.as_slice::<f32>(), &values);
    let one = Array::from_slice(&[bf16::from_f32(-3.5)], &[1]);
    assert_eq!(one.item_exact::<bf16>(), bf16::from_f32(-3.5));
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn blas_comes_from_the_system_openblas() {
    // Force MLX to load and use its CPU backend before reading the process map.
    let a = Array::from_slice(&[1.0f32; 64 * 64], &[64, 64]);
    ops::matmul(&a, &a).unwrap().eval().unwrap();
    let libs = inference::platform::loaded_blas_libraries();
    assert!(
        libs.iter().any(|l| l.contains("libopenblas")),
        "expected OpenBLAS in the process, found {libs:?}"
    );
    assert!(
        !libs
            .iter()
            .any(|l| l.contains("libblas-") && !l.contains("openblas")),
        "the wheel's reference BLAS is loaded: {libs:?}"
    );
}

/// Weights can be moved onto huge pages (decoding reads them all at every token).
#[cfg(target_os = "linux")]
#[test]
fn weights_are_advised_to_huge_pages() {
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let check = if thp.contains("[madvise]") || thp.contains("[always]") {
        Ok(())
    } else {
        Err(format!(
            "transparent huge pages are off on this kernel ({thp:?})"
        ))
    };
    if !kit::skip::can_run(
        check,
        "enable them: echo madvise > /sys/kernel/mm/transparent_hugepage/enabled",
    ) {
        return;
    }
    let weights = ops::ones::<f32>(&[4096, 1024]).unwrap();
    weights.eval().unwrap();
    let advised = inference::platform::prefer_huge_pages(&[&weights]);
    assert!(advised >= weights.nbytes(), "advised {advised} bytes");
    // The values are untouched.
    let sum = weights.sum(None).unwrap();
    sum.eval().unwrap();
    assert_eq!(sum.as_slice::<f32>()[0], 4096.0 * 1024.0);
}
