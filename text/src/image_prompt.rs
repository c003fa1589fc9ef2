//! How a model's prompt holds an image (issue 47), on the node that renders it: the chat
//! template shows each image as the model's begin-of-image text (Gemma 3's `<start_of_image>`)
//! or image placeholder (Qwen3.5's `<|image_pad|>`), which is expanded here, as the Hugging
//! Face processor and mlx-vlm expand it, to the image's run of image tokens before the prompt is
//! tokenized. Reading which model holds images how is `inference::vision` (it needs the
//! model's tower configuration); the features come from the tower there.

use crate::qwen_image_processor::QwenImageProcessor;
use wire::chat::ChatImage;

/// How a model's prompt holds an image: the texts of its image tokens and how many image
/// tokens one image takes (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePrompt {
    /// The begin-of-image text the chat template writes for each image.
    pub boi: String,
    /// The image token's text (one per image feature).
    pub image: String,
    /// The end-of-image text.
    pub eoi: String,
    /// Image tokens per image.
    pub tokens_per_image: usize,
    /// Bytes the tower and projector take as they run (float32): what placement counts on
    /// the rank that embeds.
    pub tower_bytes: u64,
    /// For a tower whose token count follows the image's size (Qwen3.5's), its processor:
    /// `tokens_per_image` is then 0 and [`ImagePrompt::expand_images`] counts each image's.
    pub sized: Option<QwenImageProcessor>,
}

/// An image's size: what the gateway found, or its file's header when not given.
fn image_size(image: &ChatImage) -> std::result::Result<(u32, u32), String> {
    if image.width > 0 && image.height > 0 {
        return Ok((image.width, image.height));
    }
    image::ImageReader::new(std::io::Cursor::new(&image.data))
        .with_guessed_format()
        .map_err(|e| e.to_string())?
        .into_dimensions()
        .map_err(|e| format!("the image cannot be decoded: {e}"))
}

impl ImagePrompt {
    /// `text` (a rendered prompt holding `images`) with each image's placeholder expanded to
    /// its run of image tokens, as the model's processor expands it: Gemma 3's begin-of-image
    /// as [`ImagePrompt::expand`] does; Qwen3.5's `<|image_pad|>` (inside the template's
    /// `<|vision_start|>…<|vision_end|>`) to one token per merged block of the image resized
    /// to the pixel budget. An error when the template did not place one per image, or an
    /// image's size cannot be read.
    pub fn expand_images(
        &self,
        text: &str,
        images: &[ChatImage],
    ) -> std::result::Result<String, String> {
        let Some(processor) = &self.sized else {
            return self.expand(text, images.len());
        };
        let pieces: Vec<&str> = text.split(self.image.as_str()).collect();
        if pieces.len() != images.len() + 1 {
            return Err(format!(
                "the chat template placed {} images for the {} sent; this model's template \
                 cannot show them",
                pieces.len() - 1,
                images.len()
            ));
        }
        let mut out = String::from(pieces[0]);
        for (image, piece) in images.iter().zip(&pieces[1..]) {
            let (width, height) = image_size(image)?;
            let tokens = processor.tokens(width, height).map_err(|e| e.to_string())?;
            out.push_str(&self.image.repeat(tokens));
            out.push_str(piece);
        }
        Ok(out)
    }

    /// `text` (a rendered prompt holding `images` images) with each begin-of-image text
    /// expanded to the image's token run, as the model's processor expands it. An error when
    /// the template did not write one begin-of-image per image (a template that does not
    /// show images).
    pub fn expand(&self, text: &str, images: usize) -> std::result::Result<String, String> {
        let found = text.matches(self.boi.as_str()).count();
        if found != images {
            return Err(format!(
                "the chat template placed {found} images for the {images} sent; this model's \
                 template cannot show them"
            ));
        }
        let run = format!(
            "\n\n{}{}{}\n\n",
            self.boi,
            self.image.repeat(self.tokens_per_image),
            self.eoi
        );
        Ok(text.replace(self.boi.as_str(), &run))
    }
}
