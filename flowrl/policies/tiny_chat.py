"""Tiny, offline components for the chat-template families: FLUX.2 [dev] (Mistral3), FLUX.2 [klein] and Z-Image
(Qwen3), built from config objects like ``tiny.py`` (same classes as the real models, random weights, float32).

The text encoders are decoder LMs read through ``output_hidden_states``; the tiny ones keep the real layer
*indices* valid (FLUX.2 dev reads hidden states 10, 20, 30 and klein 9, 18, 27, so they have 30 layers of width
16), which keeps every ``Config`` default the published one. Tokenizers are BPE models trained here
(``tiny._train_bpe``) with each family's special tokens and a chat template set in code: ``QWEN_TEMPLATE``
renders Qwen3's ``enable_thinking`` switch (False appends the empty ``<think>\\n\\n</think>\\n\\n`` block, as
Qwen3's own template does), ``MISTRAL_TEMPLATE`` the system / user turns of Mistral Small 3 with text content
lists. FLUX.2 dev's tokenizer is a ``PixtralProcessor`` (the pipeline calls ``processor.apply_chat_template``).
"""
from __future__ import annotations

import torch

from flowrl.policies.tiny import _train_bpe

QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}[SYSTEM_PROMPT]"
    "{% for c in m['content'] %}{{ c['text'] }}{% endfor %}[/SYSTEM_PROMPT]{% else %}[INST]"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% else %}[IMG]{% endif %}{% endfor %}"
    "[/INST]{% endif %}{% endfor %}")
TEXT_WIDTH = 16          # hidden size of the tiny text encoders; FLUX.2 joint_attention_dim = 3 × this
VOCAB = 1000


def qwen_tokenizer(model_max_length: int = 512):
    """Qwen2-like fast tokenizer (pad ``<|endoftext|>`` = 0, ``<|im_start|>`` / ``<|im_end|>``) with QWEN_TEMPLATE."""
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = PreTrainedTokenizerFast(tokenizer_object=_train_bpe(specials, "<|endoftext|>", VOCAB),
                                  pad_token="<|endoftext|>", eos_token="<|im_end|>", unk_token="<|endoftext|>",
                                  model_max_length=model_max_length)
    tok.chat_template = QWEN_TEMPLATE
    return tok


def mistral_processor(model_max_length: int = 512):
    """PixtralProcessor (Mistral Small 3 specials, ``[IMG]`` = id 8) with MISTRAL_TEMPLATE."""
    from transformers import PixtralImageProcessor, PixtralProcessor, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
    tok = PreTrainedTokenizerFast(tokenizer_object=_train_bpe(specials, "<unk>", VOCAB), bos_token="<s>",
                                  eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                  model_max_length=model_max_length)
    return PixtralProcessor(image_processor=PixtralImageProcessor(), tokenizer=tok, patch_size=4,
                            chat_template=MISTRAL_TEMPLATE)


def qwen3_encoder(num_layers: int = 30, causal_lm: bool = True, width: int = TEXT_WIDTH):
    """Qwen3 (Qwen3ForCausalLM as FLUX.2 klein loads it, or the bare Qwen3Model as Z-Image does); 2 heads of 8."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=width, intermediate_size=32, num_hidden_layers=num_layers,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=512,
                      pad_token_id=0, tie_word_embeddings=True)
    return (Qwen3ForCausalLM if causal_lm else Qwen3Model)(cfg).eval()


def mistral3_encoder(width: int = TEXT_WIDTH):
    """Mistral3ForConditionalGeneration: a 30-layer Mistral text model of ``width`` and a 1-layer Pixtral tower."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig

    text = MistralConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=32, num_hidden_layers=30,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=512,
                         pad_token_id=3, bos_token_id=1, eos_token_id=2)
    vision = PixtralVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 image_size=16, patch_size=4, head_dim=8)
    cfg = Mistral3Config(text_config=text, vision_config=vision, image_token_index=8, spatial_merge_size=1,
                         vision_feature_layer=-1, projector_hidden_act="gelu")
    return Mistral3ForConditionalGeneration(cfg).eval()


def flux2_vae(seed: int, blocks: int = 1, latent_channels: int = 4):
    """AutoencoderKLFlux2 of factor 2^(blocks − 1) (default 1) and ``latent_channels`` (×4 after the 2×2
    patchify); BatchNorm running statistics set to non-trivial values so the pipeline's normalisation is exercised."""
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(seed)
    vae = AutoencoderKLFlux2(block_out_channels=(4,) * blocks, layers_per_block=1, latent_channels=latent_channels,
                             norm_num_groups=1, down_block_types=("DownEncoderBlock2D",) * blocks,
                             up_block_types=("UpDecoderBlock2D",) * blocks, sample_size=32, use_quant_conv=False,
                             use_post_quant_conv=False)
    g = torch.Generator().manual_seed(seed)
    vae.bn.running_mean.copy_(0.3 * torch.randn(vae.bn.num_features, generator=g))
    vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.num_features, generator=g))
    return vae.eval()


def flux2_components(seed: int = 0, klein: bool = False) -> dict:
    """Flux2Pipeline (dev: guidance embedding, Mistral3) or Flux2KleinPipeline (klein: no guidance embedding,
    Qwen3) components; the scheduler is FLUX.2's (dynamic shifting, μ from ``compute_empirical_mu``)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel

    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                          attention_head_dim=16, num_attention_heads=2,
                                          joint_attention_dim=3 * TEXT_WIDTH, timestep_guidance_channels=32,
                                          axes_dims_rope=(4, 4, 4, 4), guidance_embeds=not klein)
    torch.manual_seed(seed)
    text_encoder, tokenizer = (qwen3_encoder(), qwen_tokenizer()) if klein else (mistral3_encoder(),
                                                                                 mistral_processor())
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)
    return {"transformer": transformer, "vae": flux2_vae(seed), "scheduler": scheduler,
            "text_encoder": text_encoder, "tokenizer": tokenizer}


def zimage_components(seed: int = 0) -> dict:
    """ZImagePipeline components: S3-DiT with patch 2, plain AutoencoderKL (factor 1, 4 channels), Qwen3."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel

    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32,
                                           n_layers=2, n_refiner_layers=1, n_heads=2, n_kv_heads=2,
                                           cap_feat_dim=TEXT_WIDTH, axes_dims=[8, 4, 4], axes_lens=[256, 32, 32])
    with torch.no_grad():          # the pad tokens start at zero; random ones make padding visible in tests
        transformer.x_pad_token.normal_()
        transformer.cap_pad_token.normal_()
    torch.manual_seed(seed)
    vae = AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                        latent_channels=4, norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False,
                        shift_factor=0.1159, scaling_factor=0.3611)
    torch.manual_seed(seed)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    return {"transformer": transformer, "vae": vae, "scheduler": scheduler,
            "text_encoder": qwen3_encoder(2, causal_lm=False), "tokenizer": qwen_tokenizer()}
