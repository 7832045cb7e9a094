"""OCR reward: the Flow-GRPO formula with a fake engine; Levenshtein against an independent reference."""
import math
from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import RewardError, RewardSet, make_input
from rewards.ocr import levenshtein, ocr_score, target_text


def lev_reference(a: str, b: str) -> int:
    """The textbook recursion (independent of the two-row DP)."""
    @lru_cache(None)
    def d(i, j):
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))
    return d(len(a), len(b))


@settings(max_examples=60, deadline=None)
@given(st.text("abc ", max_size=7), st.text("abc ", max_size=7))
def test_levenshtein_matches_recursion(a, b):
    assert levenshtein(a, b) == lev_reference(a, b)


def test_known_distances():
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3 and levenshtein("ab", "ab") == 0


def test_targets():
    assert target_text('a sign that says "Hello World" in red') == "helloworld"
    assert target_text("a cat") is None and target_text('a quote " only') is None
    assert target_text('empty ""') is None
    assert target_text("a cat", {"ocr_text": "Meow"}) == "meow"


def test_formula():
    assert ocr_score("xx HELLO world yy", "helloworld") == 1.0          # substring → distance 0
    assert ocr_score("helo", "hello") == pytest.approx(1 - 1 / 5)
    assert ocr_score("completely different text", "hi") == 0.0         # capped at |t|
    assert math.isnan(ocr_score("anything", None))


def test_reward_with_fake_engine():
    x = torch.stack([torch.zeros(3, 8, 8), torch.ones(3, 8, 8), torch.zeros(3, 8, 8)])
    prompts = ['a sign "hello world"', 'a sign "hello world"', "no quoted text"]
    rs = RewardSet.from_config({"ocr": {"kwargs": {"engine": "reward_fakes:FakeOCREngine"}}})
    s = rs(make_input(x, prompts)).scores[:, 0]
    assert s[0] == pytest.approx(0.9) and s[1] == 0.0 and math.isnan(s[2])


def test_missing_engine_is_clear():
    rs = RewardSet.from_config({"ocr": {"kwargs": {"engine": "tesseract"}}})
    with pytest.raises(RewardError, match="reward 'ocr'.*unknown OCR engine 'tesseract'"):
        rs(make_input(torch.zeros(1, 3, 8, 8), ['"a"']))
