"""Client reward that asks a ``rewards.server`` over HTTP (Flow-GRPO's remote GenEval pattern, ``rewards.py``).

Retries connection errors (refused, reset, no reply), timeouts, malformed HTTP replies and 5xx replies with
exponential backoff (``backoff_s · 2^attempt``); a 4xx reply is the caller's fault (bad token, malformed or
oversized body, content the reward rejects) and raises at once with the server's reason, never retried.
"""
from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from torch import Tensor

from rewards.base import RewardInput
from rewards.wire import CONTENT_TYPE, decode_scores, encode_request


@dataclass
class Config:
    url: str = "http://127.0.0.1:18085"
    token: str | None = None                  # else $token_env
    token_env: str = "FLOWRL_REWARD_TOKEN"
    timeout_s: float = 300.0
    retries: int = 3
    backoff_s: float = 1.0
    pixel_format: str = "uint8"               # or "float32" / "float16"


class RemoteRewardError(RuntimeError):
    """The server refused the request (4xx) or stayed unreachable after the retries."""


class RemoteReward:
    """Scores a batch by POSTing it to ``{url}/score``; returns the server's {"score", ...} dict."""

    Config = Config
    name = "remote"

    def __init__(self, cfg: Config | None = None):
        self.cfg = cfg or Config()
        self.token = self.cfg.token or os.environ.get(self.cfg.token_env)
        if not self.token:
            raise ValueError(f"remote reward at {self.cfg.url}: no token; set kwargs.token or ${self.cfg.token_env}")

    def _post(self, body: bytes) -> bytes:
        req = urllib.request.Request(self.cfg.url.rstrip("/") + "/score", data=body, method="POST", headers={
            "Content-Type": CONTENT_TYPE, "Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
            return resp.read()

    def __call__(self, batch: RewardInput) -> dict[str, Tensor]:
        body = encode_request(batch, self.cfg.pixel_format)
        last = None
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                time.sleep(self.cfg.backoff_s * 2 ** (attempt - 1))
            try:
                reply = self._post(body)
            except urllib.error.HTTPError as e:
                reason = _reason(e)
                if 400 <= e.code < 500:
                    raise RemoteRewardError(f"{self.cfg.url} refused the request ({e.code}): {reason}") from e
                last = f"HTTP {e.code}: {reason}"
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            else:
                return _scores(reply, self.cfg.url)
        raise RemoteRewardError(f"{self.cfg.url} failed after {self.cfg.retries + 1} attempts; last: {last}")


def _scores(reply: bytes, url: str) -> dict[str, Tensor]:
    """The scores of a 200 reply; a body that is not the wire format raises at once (retrying cannot fix it)."""
    try:
        return decode_scores(reply)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RemoteRewardError(f"{url} answered 200 with a malformed body ({type(e).__name__}: {e}): "
                                f"{reply[:200]!r}") from e


def _reason(e: urllib.error.HTTPError) -> str:
    try:
        return json.loads(e.read()).get("error", e.reason)
    except Exception:  # noqa: BLE001 - a non-JSON error body: fall back to the status text
        return str(e.reason)

