use super::*;
use proptest::prelude::*;

fn gemma3() -> ImageProcessor {
    ImageProcessor::from_json(&serde_json::json!({
        "size": {"height": 4, "width": 4}, "resample": 2, "do_rescale": true,
        "rescale_factor": 1.0 / 255.0, "do_normalize": true,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    }))
    .unwrap()
}

fn png(width: u32, height: u32, pixel: impl Fn(u32, u32) -> [u8; 4]) -> Vec<u8> {
    let picture = image::RgbaImage::from_fn(width, height, |x, y| image::Rgba(pixel(x, y)));
    let mut out = std::io::Cursor::new(Vec::new());
    picture.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[test]
fn the_configuration_is_read_and_what_is_not_built_is_refused() {
    let p = gemma3();
    assert_eq!((p.height, p.width, p.resample), (4, 4, Resample::Bilinear));
    assert_eq!(p.normalize, Some(([0.5; 3], [0.5; 3])));
    for (json, needle) in [
        (
            serde_json::json!({"size": {"height": 4, "width": 4}, "do_pan_and_scan": true}),
            "pan_and_scan",
        ),
        (serde_json::json!({"size": {"height": 4}}), "size.width"),
        (
            serde_json::json!({"size": {"height": 4, "width": 4}, "resample": 1}),
            "`resample` 1",
        ),
        (
            serde_json::json!({"size": {"height": 4, "width": 4}, "image_mean": [1, 2]}),
            "image_mean",
        ),
    ] {
        let e = ImageProcessor::from_json(&json).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
}

#[test]
fn an_image_at_the_size_is_only_rescaled_and_normalised() {
    let bytes = png(4, 4, |x, y| [(x * 60) as u8, (y * 80) as u8, 255, 255]);
    let values = gemma3().process(&bytes).unwrap();
    assert_eq!(values.len(), 3 * 16);
    // Channel planes: red grows along x, green along y, blue is 1 everywhere.
    assert_eq!(values[0], -1.0);
    assert_eq!(values[3], (180.0f64 / 255.0) as f32 * 2.0 - 1.0);
    assert_eq!(values[16 + 4], (80.0f64 / 255.0) as f32 / 0.5 - 1.0);
    assert!(values[32..].iter().all(|&v| v == 1.0));
}

#[test]
fn transparency_is_composited_onto_white_as_pil_does() {
    // PIL: alpha_composite(white, (0, 100, 200, a)).convert("RGB").
    assert_eq!(over_white(0, 0), 255);
    assert_eq!(over_white(200, 255), 200);
    assert_eq!(over_white(0, 128), 127);
    assert_eq!(over_white(100, 128), 177);
    let bytes = png(1, 1, |_, _| [0, 100, 200, 128]);
    let (_, _, rgb) = decode_rgb(&bytes).unwrap();
    assert_eq!(rgb, vec![127, 177, 227]);
}

#[test]
fn downscaling_averages_and_a_flat_image_stays_flat() {
    // 8 → 4: the triangle stretched to support 2 weighs 1/4, 3/4, 3/4, 1/4 of four inputs, so
    // inside the image one-pixel stripes average to grey; at the edge PIL renormalises the
    // three weights left (3/4 · 200 / 1.75 = 85.7).
    let stripes: Vec<u8> = (0..8 * 2)
        .flat_map(|i| [if i % 2 == 0 { 0 } else { 200 }; 3])
        .collect();
    let out = resize(&stripes, 8, 2, 4, 2, Resample::Bilinear);
    let row: Vec<u8> = out[..12].chunks(3).map(|p| p[0]).collect();
    assert_eq!(row, vec![86, 100, 100, 114]);
    let flat = vec![77u8; 5 * 3 * 3];
    for filter in [Resample::Bilinear, Resample::Bicubic] {
        let out = resize(&flat, 5, 3, 11, 7, filter);
        assert!(out.iter().all(|&v| v == 77), "{filter:?}: {out:?}");
    }
    // Coefficients sum to one in fixed point, give or take the rounding of each.
    for (in_size, out_size) in [(96, 56), (40, 56), (80, 56), (3, 1000)] {
        for (_, k) in coefficients(in_size, out_size, Resample::Bicubic) {
            let total: i32 = k.iter().sum();
            assert!(
                (total - (1 << PRECISION_BITS)).abs() <= k.len() as i32,
                "{total}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any size to any size: the right number of values, all finite and in [-1, 1].
    #[test]
    fn any_image_gives_bounded_values(w in 1u32..40, h in 1u32..40, seed in any::<u8>()) {
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i as u8).wrapping_mul(seed | 1)).collect();
        let values = gemma3().process_rgb(w, h, &rgb);
        prop_assert_eq!(values.len(), 48);
        prop_assert!(values.iter().all(|v| v.is_finite() && (-1.0..=1.0).contains(v)));
    }

    #[test]
    fn undecodable_bytes_are_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = gemma3().process(&bytes);
    }
}
