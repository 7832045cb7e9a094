"""Tiny, offline Qwen-Image / Qwen-Image-Edit components: the real classes built from config objects.

Sizes follow diffusers' ``tests/pipelines/qwenimage/test_qwenimage.py`` ``get_dummy_components`` (transformer
2 layers × 3 heads × 16, joint_attention_dim 16; VAE z_dim 4, factor 4; Qwen2.5-VL with hidden 16, 2 layers). The
hub tokenizer is replaced by a byte-level BPE trained here on the shared corpus plus the chat template text, with
the Qwen chat special tokens (``<|im_start|>``, ``<|im_end|>``, ``<|vision_start|>``, ``<|image_pad|>``, ...) as
added tokens, wrapped in ``PreTrainedTokenizerFast``; the VL config's token ids point at them. The VAE's
``latents_mean`` / ``latents_std`` are non-trivial so decode's normalisation is exercised. The edit preset adds a
``Qwen2VLProcessor`` (default image processor, this tokenizer).
"""
from __future__ import annotations

import torch

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>")
TEMPLATE_TEXT = ("Describe the image by detailing the color, shape, size, texture, quantity, text, spatial "
                 "relationships of the objects and background: system user assistant Describe the key features of "
                 "the input image (color, shape, size, texture, objects, background), then explain how the user's "
                 "text instruction should alter or modify the image. Generate a new image that meets the user's "
                 "requirements while maintaining consistency with the original input where appropriate.")


def qwen_tokenizer(vocab_size: int = 700):
    """Byte-level BPE with the Qwen chat special tokens (pad = ``<|endoftext|>``), a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from flowrl.policies.tiny import _corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus() + [TEMPLATE_TEXT] * 4, trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                  model_max_length=32768)
    out.add_special_tokens({"additional_special_tokens": list(SPECIALS[1:])})
    return out


def qwen_vl_text_encoder(tokenizer, seed: int = 0, width: int = 16, layers: int = 2):
    """Qwen2_5_VLForConditionalGeneration with text hidden ``width`` (16: 2 heads of 8, mrope_section (2, 1, 1);
    wider: heads of 128 split (16, 24, 24) like Qwen2.5-VL-7B), ``layers`` layers, vision tower depth 2 → width."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    n = len(tokenizer)
    heads = max(2, width // 128)
    half = width // heads // 2
    first = half - 2 * ((half - half // 4) // 2)
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": width, "intermediate_size": 16, "num_hidden_layers": layers,
                     "num_attention_heads": heads, "num_key_value_heads": heads, "rope_theta": 1e6, "vocab_size": n,
                     "rope_scaling": {"mrope_section": [first, (half - first) // 2, (half - first) // 2],
                                      "rope_type": "default", "type": "default"},
                     "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
                     "pad_token_id": ids["<|endoftext|>"]},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2,
                       "out_hidden_size": width},
        vocab_size=n, vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def qwen_processor(tokenizer):
    """Qwen2VLProcessor from the default image / video processors and ``tokenizer`` (the edit pipeline's VL input)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=tokenizer,
                            video_processor=Qwen2VLVideoProcessor())


def qwen_scheduler():
    """FlowMatchEulerDiscreteScheduler with the Qwen/Qwen-Image scheduler config (dynamic shift, base/max seq len
    256/8192, shift 0.5/0.9, shift_terminal 0.02)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192,
                                           max_shift=0.9, num_train_timesteps=1000, shift=1.0, shift_terminal=0.02,
                                           use_dynamic_shifting=True, time_shift_type="exponential")


def qwen_image_components(seed: int = 0, edit: bool = False) -> dict:
    """QwenImagePipeline components (``edit``: QwenImageEditPipeline's, with the processor)."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                              attention_head_dim=16, num_attention_heads=3, joint_attention_dim=16,
                                              guidance_embeds=False, axes_dims_rope=(8, 4, 4))
    torch.manual_seed(seed)
    vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                 latents_std=[1.5, 0.8, 1.2, 1.1])
    tokenizer = qwen_tokenizer()
    parts = {"transformer": transformer, "vae": vae.eval(), "scheduler": qwen_scheduler(),
             "text_encoder": qwen_vl_text_encoder(tokenizer, seed), "tokenizer": tokenizer}
    if edit:
        parts["processor"] = qwen_processor(tokenizer)
    return parts
