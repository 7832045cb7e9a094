"""The offline path: the preference JSONL's rules (one-line errors), the latent cache, and the offline stage's
record stream (every record once per epoch, its NFEs counted once)."""
import json
from types import SimpleNamespace

import pytest
import torch

from flowrl.data.preferences import cached_latents, read_records, save_image
from flowrl.objectives.dpo import Config, trains_on
from flowrl.training.offline import OfflineStage


class IdentityVAE:
    device = "cpu"
    calls = 0

    def encode_pixels(self, px):
        IdentityVAE.calls += 1
        return px * 2 - 1


def write(tmp_path, records):
    for name in ("a.png", "b.png"):
        save_image(torch.rand(3, 4, 4, generator=torch.Generator().manual_seed(len(name))), tmp_path / name)
    (tmp_path / "preferences.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


GOOD = {"prompt": "a red circle", "chosen": "a.png", "rejected": "b.png", "chosen_score": 1.0, "rejected_score": 0.5,
        "nfe": 32, "meta": {"skill": "color"}}


@pytest.mark.parametrize("bad, match", [
    ({"chosen": "a.png"}, "'prompt'"),
    ({**GOOD, "rejected": None}, "'rejected' is required"),
    ({**GOOD, "chosen": "missing.png"}, "not found"),
    ({**GOOD, "chosen_score": 0.1}, "chosen_score 0.1 < rejected_score"),
    ({**GOOD, "winner": "a.png"}, "unknown keys"),
    ({**GOOD, "nfe": -1}, "non-negative"),
])
def test_bad_records_are_refused(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        read_records(write(tmp_path, [bad]))


def test_records_and_latent_cache(tmp_path):
    folder = write(tmp_path, [GOOD, {**GOOD, "chosen": "b.png", "rejected": "a.png", "chosen_score": None}])
    recs = read_records(folder)
    assert recs[0].chosen == (folder / "a.png").resolve() and recs[0].nfe == 32 and recs[0].meta == {"skill": "color"}
    IdentityVAE.calls = 0
    lat = cached_latents(IdentityVAE(), recs, folder)
    assert lat["chosen"].shape == (2, 3, 4, 4) and torch.equal(lat["chosen"][0], lat["rejected"][1])
    assert IdentityVAE.calls == 4
    again = cached_latents(IdentityVAE(), recs, folder)
    assert IdentityVAE.calls == 4 and torch.equal(again["chosen"], lat["chosen"])       # from the cache
    assert trains_on(Config(data=str(folder))).offline and not trains_on(Config()).offline


def test_offline_stream_covers_each_record_once_per_epoch(tmp_path):
    source = trains_on(Config(data=str(write(tmp_path, [GOOD] * 5))))
    stage = OfflineStage.__new__(OfflineStage)
    stage.data, stage.per_iter, stage.seed = source.records(IdentityVAE()), 2, 0
    stage.dist = SimpleNamespace(local_slice=lambda n: slice(0, n), world=1)
    firsts = [[i for i, p in stage.positions(it)] for it in range(5)]       # 10 positions = 2 epochs of 5
    flat = [i for f in firsts for i in f]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:]) == list(range(5))
    counted = [p for it in range(5) for _, p in stage.positions(it) if p < len(stage.data)]
    assert len(counted) == 5                                                 # a record's NFEs count once
    assert source.rows_per_record == 2 and stage.data.labels[0].tolist() == [1.0, -1.0]
