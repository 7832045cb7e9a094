"""LAION improved aesthetic predictor v2 (christophschuhmann/improved-aesthetic-predictor), as in DiffusionNFT
``aesthetic_scorer.py``:

    s = MLP(e / ‖e‖),  e = CLIP ViT-L/14 projected image embedding (openai/clip-vit-large-patch14)

MLP: Linear(768,1024)·Dropout(.2)·Linear(1024,128)·Dropout(.2)·Linear(128,64)·Dropout(.1)·Linear(64,16)·
Linear(16,1), no activations; weights ``sac+logos+ava1-l14-linearMSE.pth``.  Scores ≈ 1–10.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from rewards.base import RewardInput

WEIGHTS_URL = ("https://github.com/christophschuhmann/improved-aesthetic-predictor/raw/main/"
               "sac+logos+ava1-l14-linearMSE.pth")


@dataclass
class Config:
    clip: str = "openai/clip-vit-large-patch14"       # hub id or local dir (model and processor)
    mlp_weights: str = "sac+logos+ava1-l14-linearMSE.pth"  # local file, or "hf-hub:<repo>/<file>"
    quantize_uint8: bool = True


class AestheticMLP(nn.Module):
    """The predictor head; parameter names match the released .pth (``layers.{0,2,4,6,7}``)."""

    def __init__(self, input_size: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
        )

    def forward(self, embed: Tensor) -> Tensor:
        return self.layers(embed)


def resolve_file(path: str, what: str, url: str | None = None) -> str:
    """A local file, or ``hf-hub:<org>/<repo>/<file>`` fetched with huggingface_hub; else a clear error."""
    if path.startswith("hf-hub:"):
        from huggingface_hub import hf_hub_download

        org, repo, filename = path[len("hf-hub:"):].split("/", 2)
        return hf_hub_download(repo_id=f"{org}/{repo}", filename=filename)
    if not Path(path).expanduser().is_file():
        hint = f" (download it from {url})" if url else ""
        raise FileNotFoundError(f"{what} not found at {path!r}{hint}; set the reward's kwargs to its path")
    return str(Path(path).expanduser())


class Aesthetic:
    """LAION aesthetic score of each image (higher = more aesthetic)."""

    Config = Config
    name = "aesthetic"
    accepts = ("image",)

    def __init__(self, cfg: Config | None = None):
        self.cfg = cfg or Config()
        self.model = None

    def setup(self, device: torch.device, dtype: torch.dtype) -> None:
        from rewards.clip_hf import load_clip, processor_geometry

        self.model, processor = load_clip(self.cfg.clip, self.cfg.clip, device, dtype)
        self.geometry = processor_geometry(processor)
        mlp = AestheticMLP(self.model.config.projection_dim)
        state = torch.load(resolve_file(self.cfg.mlp_weights, "aesthetic MLP weights", WEIGHTS_URL),
                           map_location="cpu", weights_only=True)
        mlp.load_state_dict(state)
        self.mlp = mlp.eval().to(device=device, dtype=torch.float32)
        self.device, self.dtype = device, dtype

    def __call__(self, batch: RewardInput) -> Tensor:
        from rewards.clip_hf import image_embeds, pixel_values

        px = pixel_values(batch.pixels.to(self.device), self.geometry, self.cfg.quantize_uint8, self.dtype)
        return self.mlp(image_embeds(self.model, px)).squeeze(1).cpu()
