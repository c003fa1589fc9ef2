//! Images in chat requests, as every API sends them: OpenAI's `image_url` parts and the
//! Responses API's `input_image` (data URLs), Anthropic's `image` blocks (a base64 source) and
//! Ollama's `images` (base64 strings). Each image is decoded once here, within the limits
//! below, so that a corrupt, oversized or unsupported file is a 400 naming its field before
//! anything is queued; the encoded bytes then travel with the chat ([`ChatImage`]).
//!
//! Whether the model can see images is decided where the prompt is rendered (the node holding
//! the instance's rank 0): a model without a vision tower answers 400 "model X does not accept
//! images", never a silent drop.
//!
//! http(s) image URLs are refused: this node does not fetch them (fetching, behind an operator
//! flag with size and time limits, is left for later).

use crate::backend::ChatMessage;
use crate::error::{echo, ApiError};
use base64::Engine;
use image::{ImageFormat, ImageReader};
use serde_json::Value;
pub use wire::chat::ChatImage;

/// Largest encoded image, in bytes (8 MiB).
pub const MAX_IMAGE_BYTES: usize = 8 << 20;
/// Most images' encoded bytes in one request, all together (10 MiB): a forwarded chat carries
/// them as base64 inside one frame of at most 16 MiB.
pub const MAX_REQUEST_IMAGE_BYTES: usize = 10 << 20;
/// Most pixels of one image (16 Mpx, 4096 × 4096): decoding it takes at most 64 MiB.
pub const MAX_IMAGE_PIXELS: u64 = 1 << 24;
/// Longest side of one image, in pixels.
pub const MAX_IMAGE_SIDE: u32 = 16_384;
/// Most images in one request.
pub const MAX_IMAGES: usize = 16;

/// The error code of every refused image.
const INVALID_IMAGE: &str = "invalid_image";

fn refused(param: &str, message: String) -> ApiError {
    ApiError::invalid_field(param, message).with_code(INVALID_IMAGE)
}

/// An image given as a URL (OpenAI's `image_url.url`, the Responses API's `image_url`): a
/// base64 `data:` URL is decoded; an http(s) URL is refused with a 400 saying to send the
/// image inline, since this node does not fetch URLs.
pub fn image_from_url(url: &str, param: &str) -> Result<ChatImage, ApiError> {
    let Some(rest) = url.strip_prefix("data:") else {
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        return Err(
            if matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
                refused(
                    param,
                    "image URLs are not fetched by this node; send the image inline as a data URL \
                 (`data:image/png;base64,...`)"
                        .into(),
                )
            } else {
                refused(
                    param,
                    format!(
                        "`{}` is not an image URL this node reads; send a data URL \
                     (`data:image/png;base64,...`)",
                        echo(url)
                    ),
                )
            },
        );
    };
    let Some((header, data)) = rest.split_once(',') else {
        return Err(refused(
            param,
            "a data URL needs a `,` before its data".into(),
        ));
    };
    if !header.to_ascii_lowercase().ends_with(";base64") {
        return Err(refused(
            param,
            format!(
                "the data URL's header `data:{}` does not say `;base64`; only base64 data URLs \
                 are read",
                echo(header)
            ),
        ));
    }
    image_from_base64(data, param)
}

/// OpenAI chat's `image_url` part: `{"type": "image_url", "image_url": {"url": "data:...", "detail": ...}}`
/// (the URL alone as a string is read too). `detail` is accepted and ignored: the model's image
/// processor decides the resolution.
pub(crate) fn image_url_part(part: &Value, param: &str) -> Result<ChatImage, ApiError> {
    let url = match part.get("image_url") {
        Some(Value::String(url)) => url,
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(url)) => url,
            _ => {
                return Err(ApiError::invalid_field(
                    &format!("{param}.image_url.url"),
                    "an image_url part needs a string `image_url.url`",
                ))
            }
        },
        _ => {
            return Err(ApiError::invalid_field(
                &format!("{param}.image_url"),
                "an image_url part needs an `image_url` object with a `url`",
            ))
        }
    };
    image_from_url(url, &format!("{param}.image_url.url"))
}

/// An image given as base64 text (Anthropic's `source.data`, Ollama's `images` items).
pub fn image_from_base64(text: &str, param: &str) -> Result<ChatImage, ApiError> {
    // Three bytes per four characters: refuse an oversized image before decoding it.
    if text.len() / 4 * 3 > MAX_IMAGE_BYTES + 3 {
        return Err(too_large(param, text.len() / 4 * 3));
    }
    let cleaned: String;
    let text = if text.bytes().any(|b| b.is_ascii_whitespace()) {
        // Line-wrapped base64 (MIME style) is still base64.
        cleaned = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        &cleaned
    } else {
        text
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| refused(param, format!("the image is not valid base64: {e}")))?;
    decode_image(bytes, param)
}

fn too_large(param: &str, bytes: usize) -> ApiError {
    refused(
        param,
        format!(
            "the image is {bytes} bytes; the most this node accepts is {MAX_IMAGE_BYTES} bytes"
        ),
    )
}

/// Checks an encoded image: PNG, JPEG, WebP or GIF (its first frame), at most
/// [`MAX_IMAGE_BYTES`] bytes, [`MAX_IMAGE_PIXELS`] pixels and [`MAX_IMAGE_SIDE`] a side, and
/// decodable to the end. The size is read from the header first, so that a small file claiming
/// a huge picture is refused without allocating it. Never panics, whatever the bytes.
pub fn decode_image(bytes: Vec<u8>, param: &str) -> Result<ChatImage, ApiError> {
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(too_large(param, bytes.len()));
    }
    let format = match image::guess_format(&bytes) {
        Ok(f @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif)) => f,
        Ok(other) => {
            return Err(refused(
                param,
                format!(
                    "{} images are not accepted; send PNG, JPEG, WebP or GIF",
                    other.extensions_str().first().unwrap_or(&"these")
                ),
            ))
        }
        Err(_) => {
            return Err(refused(
                param,
                "the data is not a PNG, JPEG, WebP or GIF image".into(),
            ))
        }
    };
    let name = format!("{format:?}").to_uppercase();
    let unreadable = |e: image::ImageError| {
        refused(
            param,
            format!(
                "the {name} image could not be decoded: {}",
                echo(&e.to_string())
            ),
        )
    };
    let reader = || ImageReader::with_format(std::io::Cursor::new(&bytes[..]), format);
    // The header alone first (no limits, so that an oversized image gets this node's own
    // message); the pixels then under limits, should the header have lied.
    let (width, height) = reader().into_dimensions().map_err(unreadable)?;
    let pixels = u64::from(width) * u64::from(height);
    if pixels > MAX_IMAGE_PIXELS || width > MAX_IMAGE_SIDE || height > MAX_IMAGE_SIDE {
        return Err(refused(
            param,
            format!(
                "the image is {width}×{height} pixels; the most this node accepts is \
                 {MAX_IMAGE_PIXELS} pixels and {MAX_IMAGE_SIDE} a side"
            ),
        ));
    }
    if pixels == 0 {
        return Err(refused(param, "the image has no pixels".into()));
    }
    let mut limited = reader();
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE);
    limits.max_image_height = Some(MAX_IMAGE_SIDE);
    // The decoded picture (four bytes a pixel at most) and the decoder's own buffers.
    limits.max_alloc = Some(MAX_IMAGE_PIXELS * 4 + (16 << 20));
    limited.limits(limits);
    limited.decode().map_err(unreadable)?;
    Ok(ChatImage {
        data: bytes,
        width,
        height,
    })
}

/// Checks a request's images all together: at most [`MAX_IMAGES`], and at most
/// [`MAX_REQUEST_IMAGE_BYTES`] bytes in all.
pub fn check_request_images(messages: &[ChatMessage]) -> Result<(), ApiError> {
    let images = messages.iter().flat_map(|m| &m.images);
    let (count, bytes) = images.fold((0usize, 0usize), |(n, b), i| (n + 1, b + i.data.len()));
    if count > MAX_IMAGES {
        return Err(refused(
            "messages",
            format!("the request has {count} images; the most this node accepts is {MAX_IMAGES}"),
        ));
    }
    if bytes > MAX_REQUEST_IMAGE_BYTES {
        return Err(refused(
            "messages",
            format!(
                "the request's images are {bytes} bytes in all; the most this node accepts is \
                 {MAX_REQUEST_IMAGE_BYTES}"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "images_tests.rs"]
mod tests;
