"""Tiny random reward backbones built from config objects and saved like the real checkpoints (no download)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

PROJ = 16


def hf_clip_dir(path: Path, image_size: int = 32, seed: int = 0) -> Path:
    """A tiny transformers CLIPModel + CLIPProcessor (byte-level vocab, shortest-edge resize) in ``path``."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    vocab = {}
    for c in (chr(i) for i in range(33, 127)):
        vocab[c], vocab[c + "</w>"] = len(vocab), len(vocab) + 1
    for s in ("<|startoftext|>", "<|endoftext|>"):
        vocab[s] = len(vocab)
    tok = CLIPTokenizer(vocab=vocab, merges=[])
    ip = CLIPImageProcessor(size={"shortest_edge": image_size},
                            crop_size={"height": image_size, "width": image_size})
    CLIPProcessor(image_processor=ip, tokenizer=tok).save_pretrained(path)
    bos, eos = vocab["<|startoftext|>"], vocab["<|endoftext|>"]
    layers = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
              "projection_dim": PROJ}
    text = {**layers, "vocab_size": len(vocab), "max_position_embeddings": 77, "bos_token_id": bos,
            "eos_token_id": eos, "pad_token_id": eos}
    vision = {**layers, "image_size": image_size, "patch_size": 8}
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=PROJ))
    with torch.no_grad():
        model.logit_scale.fill_(2.0)
    model.save_pretrained(path)
    return path


def open_clip_config(path: Path, name: str = "TinyCLIP-rewards-test") -> Path:
    """A JSON open_clip model config for a tiny ViT CLIP (file stem = model name)."""
    cfg = {"embed_dim": PROJ,
           "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 16},
           "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}}
    file = path / f"{name}.json"
    file.write_text(json.dumps(cfg))
    return file


def open_clip_checkpoint(path: Path, config_file: Path, key: str | None = None, seed: int = 0) -> Path:
    """Random weights of the tiny open_clip model saved as a checkpoint (optionally under ``key``)."""
    import open_clip

    open_clip.add_model_config(str(config_file))
    torch.manual_seed(seed)
    model = open_clip.create_model(config_file.stem, pretrained=None)
    sd = model.state_dict()
    file = path / "ckpt.pt"
    torch.save({key: sd} if key else sd, file)
    return file
