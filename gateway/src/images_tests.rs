use super::*;
use proptest::prelude::*;

/// A `width`×`height` gradient encoded as `format`.
pub(crate) fn encoded(format: ImageFormat, width: u32, height: u32) -> Vec<u8> {
    let picture = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x * 7) as u8, (y * 13) as u8, ((x + y) * 3) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    picture.write_to(&mut out, format).expect("encode");
    out.into_inner()
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// CRC-32 (PNG's chunk checksum), bit by bit: tests only.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A small valid PNG whose header claims `width`×`height` (checksum fixed, so only the size
/// lies): a decompression bomb's first bytes.
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut png = encoded(ImageFormat::Png, 4, 4);
    // Signature (8), IHDR length (4), "IHDR" (4), then width and height.
    png[16..20].copy_from_slice(&width.to_be_bytes());
    png[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    png
}

fn message_of(result: Result<ChatImage, ApiError>) -> String {
    let e = result.expect_err("refused");
    assert_eq!(e.status().as_u16(), 400, "{}", e.message);
    assert_eq!(e.code.as_deref(), Some("invalid_image"));
    assert_eq!(e.param.as_deref(), Some("p"));
    e.message
}

#[test]
fn each_accepted_format_decodes_with_its_size() {
    for format in [
        ImageFormat::Png,
        ImageFormat::Jpeg,
        ImageFormat::WebP,
        ImageFormat::Gif,
    ] {
        let bytes = encoded(format, 33, 17);
        let image =
            decode_image(bytes.clone(), "p").unwrap_or_else(|e| panic!("{format:?}: {e:?}"));
        assert_eq!((image.width, image.height), (33, 17), "{format:?}");
        assert_eq!(image.data, bytes);
        let url = format!("data:image/whatever;base64,{}", base64(&bytes));
        assert_eq!(image_from_url(&url, "p").unwrap(), image, "{format:?}");
    }
}

#[test]
fn urls_other_than_base64_data_urls_are_refused_saying_why() {
    let m = message_of(image_from_url("https://example.com/cat.png", "p"));
    assert!(m.contains("not fetched") && m.contains("data URL"), "{m}");
    let m = message_of(image_from_url("HTTP://example.com/cat.png", "p"));
    assert!(m.contains("not fetched"), "{m}");
    let m = message_of(image_from_url("ftp://x/y.png", "p"));
    assert!(m.contains("ftp://x/y.png"), "{m}");
    let m = message_of(image_from_url("data:image/png,rawbytes", "p"));
    assert!(m.contains(";base64"), "{m}");
    let m = message_of(image_from_url("data:image/png;base64", "p"));
    assert!(m.contains("`,`"), "{m}");
    let m = message_of(image_from_url("data:image/png;base64,%%%%", "p"));
    assert!(m.contains("not valid base64"), "{m}");
}

#[test]
fn line_wrapped_base64_is_read() {
    let bytes = encoded(ImageFormat::Png, 8, 8);
    let wrapped: String = base64(&bytes)
        .as_bytes()
        .chunks(16)
        .map(|c| format!("{}\n", std::str::from_utf8(c).unwrap()))
        .collect();
    assert_eq!(image_from_base64(&wrapped, "p").unwrap().width, 8);
}

#[test]
fn corrupt_and_foreign_files_are_refused_saying_what_is_wrong() {
    let m = message_of(decode_image(b"hello, not an image".to_vec(), "p"));
    assert!(m.contains("not a PNG, JPEG, WebP or GIF"), "{m}");
    let m = message_of(decode_image(
        b"BM\x00\x00\x00\x00\x00\x00\x00\x00".to_vec(),
        "p",
    ));
    assert!(m.contains("bmp images are not accepted"), "{m}");
    for format in [ImageFormat::Png, ImageFormat::Gif, ImageFormat::WebP] {
        let mut bytes = encoded(format, 64, 64);
        bytes.truncate(bytes.len() / 2);
        let m = message_of(decode_image(bytes, "p"));
        assert!(m.contains("could not be decoded"), "{format:?}: {m}");
    }
    // The JPEG decoder fills a picture cut in its data (as browsers show one), but not one
    // cut in its headers.
    let mut jpeg = encoded(ImageFormat::Jpeg, 64, 64);
    jpeg.truncate(40);
    let m = message_of(decode_image(jpeg, "p"));
    assert!(m.contains("the JPEG image could not be decoded"), "{m}");
}

#[test]
fn oversized_images_are_refused_before_they_are_decoded() {
    let m = message_of(decode_image(png_claiming(5000, 5000), "p"));
    assert!(
        m.contains("5000×5000") && m.contains("16777216 pixels"),
        "{m}"
    );
    let m = message_of(decode_image(png_claiming(20_000, 2), "p"));
    assert!(m.contains("20000×2"), "{m}");
    // The header is read, not the (missing) pixels: this is quick and allocates nothing big.
    let started = std::time::Instant::now();
    let m = message_of(decode_image(png_claiming(4096, 4097), "p"));
    assert!(m.contains("4096×4097"), "{m}");
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    // Too many bytes, as base64 text or as bytes.
    let text = "A".repeat(MAX_IMAGE_BYTES / 3 * 4 + 16);
    let m = message_of(image_from_base64(&text, "p"));
    assert!(
        m.contains("the most this node accepts is 8388608 bytes"),
        "{m}"
    );
    let m = message_of(decode_image(vec![0; MAX_IMAGE_BYTES + 1], "p"));
    assert!(m.contains("8388609 bytes"), "{m}");
    let m = message_of(decode_image(png_claiming(0, 7), "p"));
    assert!(!m.is_empty());
}

#[test]
fn a_request_holds_a_bounded_number_of_images_and_bytes() {
    let image = ChatImage {
        data: vec![0; 1 << 20],
        width: 1,
        height: 1,
    };
    let with = |n: usize| {
        vec![ChatMessage {
            images: vec![image.clone(); n],
            ..ChatMessage::new("user", "x")
        }]
    };
    assert!(check_request_images(&with(10)).is_ok());
    let e = check_request_images(&with(11)).expect_err("too many bytes");
    assert!(e.message.contains("11534336 bytes"), "{}", e.message);
    let small = ChatImage {
        data: vec![0; 8],
        ..image
    };
    let many = vec![ChatMessage {
        images: vec![small; MAX_IMAGES + 1],
        ..ChatMessage::new("user", "x")
    }];
    let e = check_request_images(&many).expect_err("too many images");
    assert!(e.message.contains("17 images"), "{}", e.message);
}

/// The same image in each API's own form lands on the user message, decoded and sized, after
/// the text before it in the parts (images are shown before a message's text).
#[test]
fn every_api_puts_the_image_on_its_message() {
    use crate::ollama::request::{parse_ollama_request, Endpoint};
    let png = encoded(ImageFormat::Png, 12, 7);
    let jpeg = encoded(ImageFormat::Jpeg, 9, 5);
    let url = |b: &[u8]| format!("data:image/png;base64,{}", base64(b));
    let body = |v: serde_json::Value| v.to_string().into_bytes();
    let openai = crate::openai::request::parse_chat_request(&body(serde_json::json!({
        "model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url(&png), "detail": "low"}},
            {"type": "image_url", "image_url": url(&jpeg)}]}]})))
    .unwrap()
    .request;
    let responses = crate::responses::request::parse_responses_request(&body(serde_json::json!({
        "model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": url(&png)},
            {"type": "input_image", "image_url": url(&jpeg), "detail": "auto"}]}]})))
    .unwrap()
    .request;
    let source = |b: &[u8], t: &str| serde_json::json!({"type": "image", "source": {"type": "base64", "media_type": t, "data": base64(b)}});
    let anthropic = crate::anthropic::request::parse_messages_request(
        &body(serde_json::json!({
            "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                source(&png, "image/png"), source(&jpeg, "image/jpeg")]}]})),
        false,
    )
    .unwrap()
    .request;
    let chat = parse_ollama_request(
        &body(serde_json::json!({"model": "m", "messages": [
            {"role": "user", "content": "what is this?", "images": [base64(&png), base64(&jpeg)]}]})),
        Endpoint::Chat,
    )
    .unwrap()
    .request;
    let generate = parse_ollama_request(
        &body(serde_json::json!({"model": "m", "prompt": "what is this?",
            "images": [base64(&png), base64(&jpeg)]})),
        Endpoint::Generate,
    )
    .unwrap();
    assert!(!generate.load_only);
    for (api, request) in [
        ("openai", openai),
        ("responses", responses),
        ("anthropic", anthropic),
        ("ollama chat", chat),
        ("ollama generate", generate.request),
    ] {
        let user = request.messages.last().expect(api);
        assert_eq!(user.content, "what is this?", "{api}");
        let sizes: Vec<_> = user.images.iter().map(|i| (i.width, i.height)).collect();
        assert_eq!(sizes, vec![(12, 7), (9, 5)], "{api}");
        assert_eq!(user.images[0].data, png, "{api}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = decode_image(bytes, "p");
    }

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,300}") {
        let _ = image_from_url(&text, "p");
        let _ = image_from_base64(&text, "p");
        let _ = image_from_url(&format!("data:image/png;base64,{text}"), "p");
    }

    /// Valid files with bytes changed or cut: accepted or a 400, never a panic.
    #[test]
    fn damaged_images_are_accepted_or_refused(
        format in prop_oneof![
            Just(ImageFormat::Png),
            Just(ImageFormat::Jpeg),
            Just(ImageFormat::WebP),
            Just(ImageFormat::Gif),
        ],
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = encoded(format, 19, 11);
        for (at, value) in edits {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let keep = cut.index(bytes.len() + 1).max(bytes.len() / 2);
        bytes.truncate(keep);
        match decode_image(bytes, "p") {
            Ok(image) => prop_assert!(image.width > 0 && image.height > 0),
            Err(e) => prop_assert_eq!(e.status().as_u16(), 400),
        }
    }
}
