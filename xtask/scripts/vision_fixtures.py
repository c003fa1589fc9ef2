"""Reference fixtures of the vision models shoal runs, made by mlx-vlm itself (issue 47).

`cargo xtask setup` runs this with the pinned mlx-vlm venv (see xtask/src/vision_fixtures.rs):

    python vision_fixtures.py OUT_ROOT --tokenizer DIR

It writes:
- OUT_ROOT/images/: a few synthetic test images (PNG and JPEG, RGB and RGBA, square and not),
  drawn here with Pillow from a fixed recipe;
- OUT_ROOT/gemma3/hf/: a tiny Gemma 3 vision model (`gemma3`: a SigLIP tower, the pooling
  projector and a Gemma 3 text decoder) built with mlx-vlm's own classes, every parameter
  randomized (seeded), in the Hugging Face layout (config.json with `vision_config` and
  `text_config`, `preprocessor_config.json`, `processor_config.json`, SmolLM2's tokenizer with
  the image tokens added and a chat template that places images);
- OUT_ROOT/gemma3/f32/ and OUT_ROOT/gemma3/q4/: that folder converted by `mlx_vlm.convert`, as
  mlx-community publishes models (f32; 4-bit affine, group 64, the tower and projector left
  unquantized as mlx-vlm leaves them);
- OUT_ROOT/gemma3/pixel_values.safetensors: the image processor's pixel values of each image
  ([3, H, W], keyed by the image's file name);
- in each folder `reference.safetensors` (mlx-vlm's logits at every position of a prompt holding
  one image, the processor's `pixel_values`, the projector's image features and the prompt's
  ids) and `reference.json` (the prompt, the versions, and mlx-vlm's greedy answer);
- OUT_ROOT/qwen3_5/: the Qwen3.5 vision fixture, the same way (`vision_fixtures_qwen3_5.py`,
  beside this script).

Every file is a pure function of this script, the seed and the versions.
"""

import argparse
import contextlib
import importlib.metadata
import io
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from PIL import Image, ImageDraw

SEED = 20261207
# SmolLM2's 49152 tokens, then the image tokens this script adds.
BOI, EOI, IMAGE = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
BOI_ID, EOI_ID, IMAGE_ID = 49152, 49153, 49154
VOCAB = 49155
# A SigLIP tower over 56×56 images in 14-pixel patches (4×4 = 16 patches), pooled 2×2 into
# 4 image tokens.
IMAGE_SIZE, PATCH, TOKENS_PER_IMAGE = 56, 14, 4
TEXT_CONFIG = {
    "model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 4,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "query_pre_attn_scalar": 32, "rms_norm_eps": 1e-6, "vocab_size": VOCAB,
    "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window": 8,
    "sliding_window_pattern": 2, "max_position_embeddings": 4096,
    "mm_tokens_per_image": TOKENS_PER_IMAGE, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
}
VISION_CONFIG = {
    "model_type": "siglip_vision_model", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "patch_size": PATCH,
    "image_size": IMAGE_SIZE, "num_channels": 3, "layer_norm_eps": 1e-6,
}
# Top-level keys as Hugging Face's Gemma3Config writes them. No top-level `hidden_size`: as in
# the published checkpoints, so mlx-vlm scales the image features by its default (2048^-1/2).
# `pad_token_id` 0 (<|endoftext|>, as Gemma's pad is 0): mlx-vlm zeroes the embeddings of pad
# tokens in a prompt with images, so it must be a token no prompt holds.
CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": TEXT_CONFIG, "vision_config": VISION_CONFIG,
    "boi_token_index": BOI_ID, "eoi_token_index": EOI_ID, "image_token_index": IMAGE_ID,
    "mm_tokens_per_image": TOKENS_PER_IMAGE, "bos_token_id": 1, "eos_token_id": [0, 2],
    "pad_token_id": 0, "initializer_range": 0.02, "torch_dtype": "float32",
}
PREPROCESSOR = {
    "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
    "do_convert_rgb": True, "do_resize": True, "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_pan_and_scan": False,
    "pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}
# SmolLM2's ChatML template, its content read as a string or as a list of `text` and `image`
# items (an image renders as <start_of_image>, which the processor expands).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QUESTION = "What is in this picture?"
ANSWER_TOKENS = 8
EOS = (0, 2)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def make_images(folder):
    """The test images: `square.png` (56×56 RGB, the tower's own size: no resampling),
    `wide.png` (96×40 RGBA), `checker.jpg` (80×80 JPEG, quality 90)."""
    folder.mkdir(parents=True, exist_ok=True)
    square = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE))
    square.putdata([((x * 4) % 256, (y * 4) % 256, ((x + y) * 2) % 256)
                    for y in range(IMAGE_SIZE) for x in range(IMAGE_SIZE)])
    ImageDraw.Draw(square).ellipse((12, 10, 40, 44), fill=(230, 40, 40))
    square.save(folder / "square.png")
    wide = Image.new("RGBA", (96, 40), (20, 90, 200, 255))
    draw = ImageDraw.Draw(wide)
    for i in range(0, 96, 12):
        draw.rectangle((i, 0, i + 5, 39), fill=(250, 250, 20, 128 + i))
    wide.save(folder / "wide.png")
    checker = Image.new("RGB", (80, 80))
    checker.putdata([(255, 255, 255) if ((x // 10) + (y // 10)) % 2 else (10, 60, 10)
                     for y in range(80) for x in range(80)])
    checker.save(folder / "checker.jpg", quality=90)


def write_tokenizer(source, folder):
    """SmolLM2's tokenizer with the three image tokens added (special), and the image-aware
    chat template; `extra_special_tokens` names them for the Gemma 3 processor."""
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    for token_id, content in [(BOI_ID, BOI), (EOI_ID, EOI), (IMAGE_ID, IMAGE)]:
        tokenizer["added_tokens"].append({
            "id": token_id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config["extra_special_tokens"] = {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE}
    decoder = config.setdefault("added_tokens_decoder", {})
    for token_id, content in [(BOI_ID, BOI), (EOI_ID, EOI), (IMAGE_ID, IMAGE)]:
        decoder[str(token_id)] = {"content": content, "lstrip": False, "normalized": False,
                                  "rstrip": False, "single_word": False, "special": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def write_processor_files(folder):
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
    (folder / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Gemma3Processor", "image_seq_length": TOKENS_PER_IMAGE}, indent=2))


def randomize(model):
    """Every parameter drawn from a seeded normal: Gemma's RMS norms (which scale by 1 + w)
    near 0, SigLIP's layer norms near 1, biases and weights small."""
    rng = np.random.default_rng(SEED)
    params = []
    for name, value in sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0]):
        shape = value.shape
        if name.startswith("vision_tower") and ("layer_norm" in name or "post_layernorm" in name):
            base = 1.0 if name.endswith("weight") else 0.0
            array = base + 0.1 * rng.standard_normal(shape)
        elif "norm" in name:
            array = 0.2 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            array = 0.05 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            # Small against what the layers add: with tied embeddings a large one makes the
            # model echo its last token, whatever the image.
            array = 0.05 * rng.standard_normal(shape)
        elif "embed" in name:
            array = 0.5 * rng.standard_normal(shape)
        else:
            fan_in = shape[-1] if len(shape) > 1 else shape[0]
            if "patch_embedding" in name:
                fan_in = int(np.prod(shape[1:]))
            if "mm_input_projection_weight" in name:
                fan_in = shape[0]
            array = rng.standard_normal(shape) / np.sqrt(fan_in)
        params.append((name, mx.array(array.astype(np.float32))))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())


def build_model():
    from mlx_vlm.utils import get_model_and_args, update_module_configs
    config = json.loads(json.dumps(CONFIG))
    model_class, _ = get_model_and_args(config=config)
    model_config = model_class.ModelConfig.from_dict(config)
    model_config = update_module_configs(
        model_config, model_class, config, ["text", "vision", "perceiver", "projector", "audio"])
    model = model_class.Model(model_config)
    randomize(model)
    return model


def save_hf(model, folder):
    """The weights as Hugging Face's Gemma3ForConditionalGeneration names them (mlx-vlm's keys
    are those), the patch embedding in PyTorch's [out, in, kh, kw] order, the tied head left
    out."""
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        if name == "language_model.lm_head.weight":
            continue
        if name.endswith("patch_embedding.weight"):
            value = value.transpose(0, 3, 1, 2)
        weights[name] = value
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2))


def prompt_inputs(processor, image_path):
    """The chat (one user turn: the image, then the question) through the folder's chat
    template and mlx-vlm's Gemma 3 processor: ids with the image span expanded, and the
    pixel values."""
    messages = [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = processor.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(images=[Image.open(image_path)], text=[text], return_tensors="np")
    return text, np.asarray(inputs["input_ids"]), np.asarray(inputs["pixel_values"])


def greedy(model, processor, image_path):
    """mlx-vlm's greedy answer to the chat with this image, through its own generation loop
    (prefill from the embeddings, then the cache), up to an end-of-sequence token: the ids
    and the text."""
    from mlx_vlm.generate import generate_step
    _, ids, pixels = prompt_inputs(processor, image_path)
    input_ids = mx.array(ids)
    tokens = []
    for token, _ in generate_step(input_ids, model, mx.array(pixels), mx.ones(input_ids.shape),
                                  max_tokens=ANSWER_TOKENS, temperature=0.0):
        token = int(token.item() if hasattr(token, "item") else token)
        if token in EOS:
            break
        tokens.append(token)
    return {"tokens": tokens, "text": processor.tokenizer.decode(tokens)}


def pixel_values(folder, images, out):
    """The folder's image processor (transformers' Gemma 3 processor, as mlx-vlm loads it) on
    each image alone: what shoal's own processor must give (`<image file name>` → [3, H, W])."""
    from mlx_vlm.utils import load_processor
    processor = load_processor(folder)
    arrays = {}
    for path in images:
        values = processor.image_processor([Image.open(path)], return_tensors="np")
        arrays[path.name] = mx.array(np.asarray(values["pixel_values"])[0].astype(np.float32))
    mx.save_safetensors(str(out), arrays)


def reference(folder, image_path, images):
    """mlx-vlm on `folder` as its generation runs it: the processor's inputs, the tower and
    projector's image features, the logits at every prompt position (prefill in one step);
    and the greedy answer for each of `images`."""
    from mlx_vlm.utils import load
    with contextlib.redirect_stdout(io.StringIO()):
        model, processor = load(str(folder))
    text, ids, pixels = prompt_inputs(processor, image_path)
    input_ids, pixel_values = mx.array(ids), mx.array(pixels)
    features = model.multi_modal_projector(model.vision_tower(
        pixel_values.transpose(0, 2, 3, 1), output_hidden_states=True)[0])
    embedded = model.get_input_embeddings(
        input_ids, pixel_values, mask=mx.ones(input_ids.shape)).inputs_embeds
    logits = model.language_model(input_ids, inputs_embeds=embedded).logits
    mx.eval(features, logits)
    answers = {path.name: greedy(model, processor, path) for path in images}
    image_positions = [i for i, t in enumerate(ids[0].tolist()) if t == IMAGE_ID]
    assert len(image_positions) == TOKENS_PER_IMAGE, image_positions
    mx.save_safetensors(str(folder / "reference.safetensors"), {
        "input_ids": input_ids.astype(mx.int32),
        "pixel_values": pixel_values.astype(mx.float32),
        "image_features": features.astype(mx.float32),
        "logits": logits.astype(mx.float32),
    })
    (folder / "reference.json").write_text(json.dumps({
        "image": image_path.name,
        "question": QUESTION,
        "prompt": text,
        "image_positions": image_positions,
        "answers": answers,
        "seed": SEED,
        "versions": {p: importlib.metadata.version(p)
                     for p in ["mlx", "mlx-vlm", "transformers", "pillow", "numpy"]},
    }, indent=2, ensure_ascii=False))
    return logits


def build_gemma3(root, tokenizer, images):
    family = root / "gemma3"
    if family.exists():
        shutil.rmtree(family)
    hf = family / "hf"
    hf.mkdir(parents=True)
    model = build_model()
    save_hf(model, hf)
    write_tokenizer(tokenizer, hf)
    write_processor_files(hf)
    image = images / "square.png"
    from mlx_vlm.convert import convert
    for layout, quantize in [("f32", False), ("q4", True)]:
        out = family / layout
        log(f"gemma3/{layout}: mlx_vlm.convert ...")
        with contextlib.redirect_stdout(io.StringIO()):
            convert(str(hf), mlx_path=str(out), quantize=quantize, q_bits=4, q_group_size=64,
                    dtype="float32")
        # The processor was saved through transformers: put the exact files back.
        for name in ["tokenizer.json", "tokenizer_config.json", "preprocessor_config.json",
                     "processor_config.json"]:
            shutil.copyfile(hf / name, out / name)
        for stray in ["README.md", "chat_template.jinja", "chat_template.json"]:
            (out / stray).unlink(missing_ok=True)
    # References last: a reference.safetensors beside the weights would be read as weights.
    every = sorted(images.iterdir())
    pixel_values(hf, every, family / "pixel_values.safetensors")
    hf_logits = reference(hf, image, every)
    for layout in ["f32", "q4"]:
        logits = reference(family / layout, image, every)
        gap = float(mx.abs(logits - hf_logits).max())
        log(f"gemma3/{layout}: largest logit gap to hf {gap:.2e}")
        # Conversion keeps f32 exactly; 4-bit moves the logits (not checked here: shoal is
        # compared with mlx-vlm on the same q4 folder).
        if layout == "f32":
            assert gap <= 1e-5, f"f32: mlx-vlm's logits moved by {gap} after convert"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="folder with SmolLM2's tokenizer files")
    args = parser.parse_args()
    images = args.root / "images"
    make_images(images)
    build_gemma3(args.root, args.tokenizer, images)
    from vision_fixtures_qwen3_5 import build_qwen3_5
    build_qwen3_5(args.root, args.tokenizer, images)
    log(f"vision fixtures written under {args.root}")


if __name__ == "__main__":
    main()
