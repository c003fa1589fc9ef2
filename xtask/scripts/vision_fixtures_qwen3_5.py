"""The Qwen3.5 vision fixture (issue 47), made by mlx-vlm itself; `vision_fixtures.py` calls
`build_qwen3_5` after the Gemma 3 one.

It writes under OUT_ROOT/qwen3_5/:
- hf/: a tiny Qwen3.5 vision model (`qwen3_5`: Qwen3-VL's vision tower without deepstack, the
  patch merger, and a Qwen3.5 hybrid text decoder with interleaved M-RoPE) built with mlx-vlm's
  own classes, every parameter randomized (seeded), in Qwen's released layout (`model.visual.*`,
  `model.language_model.*`, `lm_head`, the patch kernel `[out, C, T, P, P]`, block norms
  zero-centred, convolutions `[channels, 1, kernel]`), with `preprocessor_config.json` (a pixel
  budget of 32×32 to 128×128) and SmolLM2's tokenizer plus Qwen's vision tokens and a chat
  template that writes `<|vision_start|><|image_pad|><|vision_end|>` per image;
- f32/ and q4/: that folder converted by `mlx_vlm.convert` (f32; 4-bit affine, group 64, the
  tower left as mlx-vlm leaves it);
- big.png: a 200×150 image past the pixel budget (resized down by the processor);
- pixel_values.safetensors: the processor's patches of each image (`<name>`: [patches,
  C·T·P·P]) and grids (`<name>.grid`: [t, h, w]);
- in each folder reference.safetensors (mlx-vlm's prompt ids, patches, grid, image features,
  M-RoPE position ids and logits at every prompt position for a prompt holding square.png) and
  reference.json (the prompt, the versions and mlx-vlm's greedy answer for each image).
"""

import contextlib
import importlib.metadata
import io
import json
import shutil
import sys

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from PIL import Image, ImageDraw

SEED = 20261208
START, END, IMAGE, VIDEO = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
START_ID, END_ID, IMAGE_ID, VIDEO_ID = 49152, 49153, 49154, 49155
VOCAB = 49156
PATCH, MERGE, TEMPORAL = 16, 2, 2
MIN_PIXELS, MAX_PIXELS = 32 * 32, 128 * 128
TEXT_CONFIG = {
    "model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "intermediate_size": 128, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
    "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
    "tie_word_embeddings": False, "attention_bias": False, "attn_output_gate": True,
    "vocab_size": VOCAB, "eos_token_id": [0, 2],
    "layer_types": ["linear_attention", "full_attention"] * 2,
    # Half of each 32-wide head rotated: 8 frequencies, interleaved over (t, h, w) as
    # [t, h, w, t, h, w, t, h] by the sections 3, 3, 2.
    "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
        "mrope_section": [3, 3, 2], "mrope_interleaved": True,
    },
}
VISION_CONFIG = {
    "model_type": "qwen3_5", "depth": 2, "hidden_size": 64, "intermediate_size": 128,
    "num_heads": 4, "out_hidden_size": 64, "patch_size": PATCH, "spatial_merge_size": MERGE,
    "temporal_patch_size": TEMPORAL, "in_channels": 3, "num_position_embeddings": 64,
    "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": [],
}
CONFIG = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "text_config": TEXT_CONFIG, "vision_config": VISION_CONFIG,
    "image_token_id": IMAGE_ID, "video_token_id": VIDEO_ID,
    "vision_start_token_id": START_ID, "vision_end_token_id": END_ID,
    "tie_word_embeddings": False, "eos_token_id": [0, 2], "torch_dtype": "float32",
}
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
    "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    "patch_size": PATCH, "temporal_patch_size": TEMPORAL, "merge_size": MERGE,
    "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
}
# ChatML, a list content's image items written as Qwen's templates write them.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QUESTION = "What is in this picture?"
ANSWER_TOKENS = 8
EOS = (0, 2)
NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
         ".q_norm.weight", ".k_norm.weight")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def make_big_image(path):
    """200×150 RGB, past the 128×128 budget: the processor resizes it to 128×96."""
    big = Image.new("RGB", (200, 150))
    big.putdata([((x * 5) % 256, (y * 3) % 256, (x * y) % 256)
                 for y in range(150) for x in range(200)])
    ImageDraw.Draw(big).rectangle((30, 20, 120, 90), fill=(20, 200, 60))
    big.save(path)


def write_tokenizer(source, folder):
    tokenizer = json.loads((source / "tokenizer.json").read_text())
    added = [(START_ID, START), (END_ID, END), (IMAGE_ID, IMAGE), (VIDEO_ID, VIDEO)]
    for token_id, content in added:
        tokenizer["added_tokens"].append({
            "id": token_id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    # Every added token listed, as Qwen's releases list them: transformers reads a `qwen3_5`
    # folder with Qwen3_5Tokenizer, which knows only the added tokens listed here (without
    # this, SmolLM2's <|im_end|> would be split into text).
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    decoder = config.setdefault("added_tokens_decoder", {})
    for token in tokenizer["added_tokens"]:
        decoder[str(token["id"])] = {k: token[k] for k in
                                     ["content", "lstrip", "normalized", "rstrip",
                                      "single_word", "special"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def write_processor_files(folder):
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2))
    (folder / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Qwen3VLProcessor"}, indent=2))


def randomize(model):
    """Every parameter from a seeded normal: RMS norms (stored as `w`, run as `w`) near 1,
    layer norms near 1, the delta rule's decays and write strengths spread, weights scaled by
    their fan-in."""
    rng = np.random.default_rng(SEED)
    params = []
    for name, value in sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0]):
        shape = value.shape
        if name.endswith("A_log") or name.endswith("dt_bias"):
            array = rng.standard_normal(shape)
        elif "norm" in name and name.endswith("weight"):
            array = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            array = 0.05 * rng.standard_normal(shape)
        elif "conv1d" in name:
            array = 0.5 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            array = 0.5 * rng.standard_normal(shape)
        elif "pos_embed" in name:
            array = 0.5 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
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
    """mlx-vlm's parameters in Qwen's released names and layouts (its `sanitize` inverted)."""
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        if name.startswith("vision_tower."):
            key = "model.visual." + name[len("vision_tower."):]
        elif name.startswith("language_model.model."):
            key = "model.language_model." + name[len("language_model.model."):]
        elif name.startswith("language_model.lm_head"):
            key = name[len("language_model."):]
        else:
            raise ValueError(f"unexpected parameter {name}")
        if key.endswith("patch_embed.proj.weight"):
            value = value.transpose(0, 4, 1, 2, 3)
        if "conv1d.weight" in key:
            value = value.moveaxis(2, 1)
        if key.startswith("model.language_model.") and key.endswith(NORMS) and value.ndim == 1:
            value = value - 1.0
        weights[key] = value
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(CONFIG, indent=2))


def prompt_inputs(processor, image_path):
    """One user turn (the image, then the question) through the folder's chat template and
    mlx-vlm's Qwen3-VL processor: ids with the image span expanded, patches and grid."""
    messages = [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = processor.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(images=[Image.open(image_path)], text=[text], return_tensors="np")
    return (text, np.asarray(inputs["input_ids"]), np.asarray(inputs["pixel_values"]),
            np.asarray(inputs["image_grid_thw"]))


def greedy(model, processor, image_path):
    from mlx_vlm.generate import generate_step
    _, ids, pixels, grid = prompt_inputs(processor, image_path)
    input_ids = mx.array(ids)
    tokens = []
    for token, _ in generate_step(input_ids, model, mx.array(pixels), mx.ones(input_ids.shape),
                                  max_tokens=ANSWER_TOKENS, temperature=0.0,
                                  image_grid_thw=mx.array(grid)):
        token = int(token.item() if hasattr(token, "item") else token)
        if token in EOS:
            break
        tokens.append(token)
    return {"tokens": tokens, "text": processor.tokenizer.decode(tokens)}


def pixel_values(folder, images, out):
    from mlx_vlm.utils import load_processor
    processor = load_processor(folder)
    arrays = {}
    for path in images:
        values = processor.image_processor([Image.open(path)])
        arrays[path.name] = mx.array(np.asarray(values["pixel_values"]).astype(np.float32))
        arrays[path.name + ".grid"] = mx.array(
            np.asarray(values["image_grid_thw"])[0].astype(np.int32))
    mx.save_safetensors(str(out), arrays)


def reference(folder, image_path, images):
    from mlx_vlm.utils import load
    with contextlib.redirect_stdout(io.StringIO()):
        model, processor = load(str(folder))
    text, ids, pixels, grid = prompt_inputs(processor, image_path)
    input_ids, pixel_values, grid_thw = mx.array(ids), mx.array(pixels), mx.array(grid)
    features, _ = model.vision_tower(pixel_values, grid_thw)
    embedded = model.get_input_embeddings(
        input_ids, pixel_values, image_grid_thw=grid_thw, mask=mx.ones(input_ids.shape))
    logits = model.language_model(
        input_ids, inputs_embeds=embedded.inputs_embeds,
        position_ids=embedded.position_ids).logits
    mx.eval(features, logits)
    answers = {path.name: greedy(model, processor, path) for path in images}
    image_positions = [i for i, t in enumerate(ids[0].tolist()) if t == IMAGE_ID]
    mx.save_safetensors(str(folder / "reference.safetensors"), {
        "input_ids": input_ids.astype(mx.int32),
        "pixel_values": pixel_values.astype(mx.float32),
        "image_grid_thw": grid_thw.astype(mx.int32),
        "image_features": features.astype(mx.float32),
        "position_ids": embedded.position_ids.astype(mx.int32),
        "rope_deltas": mx.array(embedded.rope_deltas).astype(mx.int32),
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


def build_qwen3_5(root, tokenizer, images):
    family = root / "qwen3_5"
    if family.exists():
        shutil.rmtree(family)
    hf = family / "hf"
    hf.mkdir(parents=True)
    make_big_image(family / "big.png")
    model = build_model()
    save_hf(model, hf)
    write_tokenizer(tokenizer, hf)
    write_processor_files(hf)
    from mlx_vlm.convert import convert
    for layout, quantize in [("f32", False), ("q4", True)]:
        out = family / layout
        log(f"qwen3_5/{layout}: mlx_vlm.convert ...")
        with contextlib.redirect_stdout(io.StringIO()):
            convert(str(hf), mlx_path=str(out), quantize=quantize, q_bits=4, q_group_size=64,
                    dtype="float32")
        for name in ["tokenizer.json", "tokenizer_config.json", "preprocessor_config.json",
                     "processor_config.json"]:
            shutil.copyfile(hf / name, out / name)
        for stray in ["README.md", "chat_template.jinja", "chat_template.json",
                      "video_preprocessor_config.json"]:
            (out / stray).unlink(missing_ok=True)
    every = sorted(images.iterdir()) + [family / "big.png"]
    pixel_values(hf, every, family / "pixel_values.safetensors")
    image = images / "square.png"
    hf_logits = reference(hf, image, every)
    for layout in ["f32", "q4"]:
        logits = reference(family / layout, image, every)
        gap = float(mx.abs(logits - hf_logits).max())
        log(f"qwen3_5/{layout}: largest logit gap to hf {gap:.2e}")
        if layout == "f32":
            assert gap <= 1e-5, f"f32: mlx-vlm's logits moved by {gap} after convert"
