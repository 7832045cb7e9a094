"""Serve any registered reward over HTTP, for rewards that need their own process, environment or GPU
(the Flow-GRPO / ddpo-pytorch "reward server" pattern, yifan123/reward-server).

    python -m rewards.server --reward pickscore --device cuda:1 --port 18085 [--kwargs '{"divisor": 1}']

Binds 127.0.0.1 unless told otherwise; every ``/score`` request must carry ``Authorization: Bearer <token>``
(``--token`` or $FLOWRL_REWARD_TOKEN, else a random one is printed).  ``GET /health`` needs no token.
Concurrent requests with the same image shape are scored together, up to ``--max-batch`` samples.
Wire format: ``rewards.wire``.  Faults and their answers (limits in ``ServerLimits``):

    client mistakes        4xx with a JSON reason, never retried by ``rewards.remote``: 400 malformed request,
                           body or Content-Length; 401 token; 404 path; 405 method; 408 request not received
                           within the idle / read timeout; 411 no Content-Length; 413 body or its unpacked
                           arrays over the limit; 422 the reward rejected the content (it raised ValueError etc.)
    server faults          500 the reward failed (RuntimeError / OSError / MemoryError); 503 scoring timed out
                           or every worker is busy and the pending queue is full (``Retry-After: 1``)
    connections            a fixed pool of worker threads behind a bounded queue and a listen backlog of 128;
                           idle or half-open connections are closed after the idle timeout
                           (``rewards.http_pool``)
"""
from __future__ import annotations

import argparse
import hmac
import json
import os
import queue
import secrets
import sys
import threading
from dataclasses import dataclass, field, fields

import torch
from torch import Tensor

from rewards.base import RewardError, RewardInput, check_input
from rewards.http_pool import PooledHTTPServer, PooledJSONHandler
from rewards.wire import WireError, WireTooLarge, decode_request, encode_scores

TRANSIENT = (RuntimeError, OSError, MemoryError)  # reward failures worth a retry (OOM, CUDA, I/O): 500


@dataclass
class ServerLimits:
    """Every bound of the reward server (sizes in bytes, times in seconds)."""

    max_bytes: int = 256 << 20            # request body (413 above)
    max_unpacked_bytes: int | None = None  # arrays after decompression (413 above); None = max_bytes
    score_timeout_s: float = 600.0        # waiting for the reward (503 after)
    idle_timeout_s: float = 30.0          # longest wait for any one read or write on a connection
    read_timeout_s: float = 120.0         # longest time to receive one whole request (408 after)
    workers: int = 32                     # threads serving connections
    pending: int = 256                    # accepted connections waiting for a worker (503 beyond)
    backlog: int = 128                    # listen queue of not-yet-accepted connections
    yield_idle_s: float = 1.0             # a connection idle between requests this long leaves when others wait
    linger_s: float = 2.0                 # after an early error reply, unread body is drained this long

    def __post_init__(self):
        if self.max_unpacked_bytes is None:
            self.max_unpacked_bytes = self.max_bytes
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"ServerLimits.{f.name} must be > 0, got {getattr(self, f.name)}")


class ScoreError(Exception):
    """A failed scoring, with the HTTP status it is answered with and the reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def score_error(e: Exception) -> ScoreError:
    """422 when the reward rejected the content (a deterministic error: ValueError, TypeError, KeyError...),
    500 when it failed in a way a retry may cure (``TRANSIENT``); looks through ``RewardError`` wrappers."""
    root = e
    while isinstance(root, RewardError) and root.__cause__ is not None:
        root = root.__cause__
    return ScoreError(500 if isinstance(root, TRANSIENT) else 422, f"{type(e).__name__}: {e}")


@dataclass
class _Job:
    batch: RewardInput
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Tensor] | None = None
    error: ScoreError | None = None


class Batcher:
    """One worker thread scoring queued requests; jobs with equal pixel shapes are merged up to max_batch.
    When a merged call fails, each request is scored alone, so a bad request fails only itself."""

    def __init__(self, reward, max_batch: int = 64, wait_s: float = 0.005):
        self.reward, self.max_batch, self.wait_s = reward, max_batch, wait_s
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="reward-batcher")
        self.thread.start()

    def score(self, batch: RewardInput, timeout: float | None = None) -> dict[str, Tensor]:
        job = _Job(batch)
        self.jobs.put(job)
        if not job.done.wait(timeout):
            raise ScoreError(503, f"the reward did not answer within {timeout} s")
        if job.error is not None:
            raise job.error
        return job.result

    def _gather(self, first: _Job) -> list[_Job]:
        group, held, n = [first], [], len(first.batch)
        shape = first.batch.pixels.shape[1:]
        while n < self.max_batch:
            try:
                job = self.jobs.get(timeout=self.wait_s)
            except queue.Empty:
                break
            if job is None or job.batch.pixels.shape[1:] != shape or n + len(job.batch) > self.max_batch:
                held.append(job)
                break
            group.append(job)
            n += len(job.batch)
        for job in held:
            self.jobs.put(job)
        return group

    def _score(self, group: list[_Job]) -> None:
        merged = RewardInput(
            pixels=torch.cat([j.batch.pixels for j in group]),
            prompts=[p for j in group for p in j.batch.prompts],
            group_ids=torch.cat([j.batch.group_ids for j in group]),
            meta=[m for j in group for m in (j.batch.meta or [{}] * len(j.batch))],
            images=None if all(j.batch.images is None for j in group) else
            [r for j in group for r in (j.batch.images or [None] * len(j.batch))],
        )
        out, start = self.reward(merged), 0
        for j in group:
            j.result = {k: v[start:start + len(j.batch)] for k, v in out.items()}
            start += len(j.batch)

    def _run(self) -> None:
        while (first := self.jobs.get()) is not None:
            group = self._gather(first)
            try:
                self._score(group)
            except Exception as e:  # noqa: BLE001 - answered to the requests concerned as 422 / 500
                for j in group:
                    try:
                        if len(group) > 1:
                            self._score([j])
                        else:
                            j.error = score_error(e)
                    except Exception as alone:  # noqa: BLE001
                        j.error = score_error(alone)
            for j in group:
                j.done.set()

    def close(self, join_s: float = 5.0) -> None:
        """Stop after the queued jobs, waiting up to ``join_s`` for the thread (see PooledHTTPServer.server_close)."""
        self.jobs.put(None)
        self.thread.join(join_s)


class _ScoreHandler(PooledJSONHandler):
    """``POST /score`` (token, body, decode, score, reply) and ``GET /health`` for one reward; ``_handler``
    binds the reward's name, batcher, token, limits and accepted media to a subclass."""

    name: str
    batcher: Batcher
    token: str
    accepts: tuple[str, ...]
    usage = "use POST /score or GET /health"

    def error_body(self, reason: str) -> dict:
        return {"error": reason, "reward": self.name}

    def do_GET(self):
        if self.path == "/health":
            self._send(200, json.dumps({"reward": self.name, "ok": True}).encode())
        else:
            self._refuse(404, f"unknown path {self.path!r}; use POST /score or GET /health")

    def _authorized(self) -> bool:
        """The path is ``/score`` and the bearer token matches; else False after a 404/401."""
        if self.path != "/score":
            self._refuse(404, f"unknown path {self.path!r}; use POST /score")
            return False
        auth = self.headers.get("Authorization", "")
        if not hmac.compare_digest(auth.encode(), f"Bearer {self.token}".encode()):
            self._refuse(401, "missing or wrong token (header 'Authorization: Bearer <token>')")
            return False
        return True

    def _score_and_reply(self, body: bytes) -> None:
        """Decode, check and score one request body and reply the scores, or 413/400 (bad request) or the
        status of the reward's failure (``ScoreError``)."""
        try:
            batch = decode_request(body, max_unpacked=self.limits.max_unpacked_bytes)
            check_input(batch, self.name, self.accepts)
            scores = self.batcher.score(batch, timeout=self.limits.score_timeout_s)
        except WireTooLarge as e:
            return self._error(413, str(e))
        except (WireError, RewardError) as e:
            return self._error(400, str(e))
        except ScoreError as e:
            return self._error(e.status, e.reason)
        self._send(200, encode_scores(self.name, scores))

    def _score(self) -> None:
        if self._authorized() and (body := self.read_request_body()) is not None:
            self._score_and_reply(body)

    def do_POST(self):
        try:
            self._score()
        except (ConnectionError, TimeoutError):  # the client left or stalled while we answered
            self.close_connection = True
        except Exception as e:
            if self.replied:
                raise
            self._error(500, f"server error: {type(e).__name__}: {e}", close=True)


def _handler(name: str, batcher: Batcher, token: str, limits: ServerLimits,
             accepts: tuple[str, ...]) -> type[_ScoreHandler]:
    """A handler class for one reward (http.server builds one handler per connection from a class)."""
    bound = {"name": name, "batcher": batcher, "token": token, "limits": limits, "accepts": accepts,
             "timeout": limits.idle_timeout_s}
    return type("Handler", (_ScoreHandler,), bound)


class RewardServer:
    """A reward behind a pooled HTTP server on ``host:port`` (port 0 = any free port); ``url`` once started."""

    def __init__(self, reward, token: str, name: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 max_batch: int = 64, limits: ServerLimits | None = None):
        if not token:
            raise ValueError("a reward server needs a token; pass one or set FLOWRL_REWARD_TOKEN")
        self.name = name or getattr(reward, "name", "reward")
        self.limits = limits or ServerLimits()
        self.batcher = Batcher(reward, max_batch=max_batch)
        accepts = tuple(getattr(reward, "accepts", ("image", "video")))
        handler = _handler(self.name, self.batcher, token, self.limits, accepts)
        self.httpd = PooledHTTPServer((host, port), handler, self.limits)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> RewardServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="reward-server")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for serve_forever, so only after start()
            self.httpd.shutdown()
            self._thread.join()
        self.httpd.server_close()
        self.batcher.close()


def _parser() -> argparse.ArgumentParser:
    d = ServerLimits()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reward", required=True, help="registered name or module:attr")
    p.add_argument("--kwargs", default="{}", help="JSON options for the reward's Config")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--batch-size", type=int, default=None, help="samples per reward call")
    p.add_argument("--max-batch", type=int, default=64, help="samples merged across concurrent requests")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18085)
    p.add_argument("--token", default=os.environ.get("FLOWRL_REWARD_TOKEN"))
    p.add_argument("--max-mb", type=float, default=d.max_bytes / (1 << 20), help="request body limit")
    p.add_argument("--max-unpacked-mb", type=float, default=None, help="unpacked arrays limit (default --max-mb)")
    p.add_argument("--workers", type=int, default=d.workers, help="threads serving connections")
    p.add_argument("--idle-timeout", type=float, default=d.idle_timeout_s, help="seconds per read/write")
    p.add_argument("--read-timeout", type=float, default=d.read_timeout_s, help="seconds per whole request")
    p.add_argument("--score-timeout", type=float, default=d.score_timeout_s, help="seconds for the reward")
    return p


def main(argv: list[str] | None = None) -> None:
    from rewards.build import build_reward

    a = _parser().parse_args(argv)
    token = a.token or secrets.token_urlsafe(24)
    if not a.token:
        print(f"FLOWRL_REWARD_TOKEN={token}", flush=True)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {a.host}, reachable beyond this machine; keep the token secret",
              file=sys.stderr)
    unpacked = None if a.max_unpacked_mb is None else int(a.max_unpacked_mb * (1 << 20))
    limits = ServerLimits(max_bytes=int(a.max_mb * (1 << 20)), max_unpacked_bytes=unpacked, workers=a.workers,
                          idle_timeout_s=a.idle_timeout, read_timeout_s=a.read_timeout,
                          score_timeout_s=a.score_timeout)
    reward = build_reward(a.reward, json.loads(a.kwargs), device=a.device, dtype=getattr(torch, a.dtype),
                          batch_size=a.batch_size)
    reward.setup()
    server = RewardServer(reward, token, name=a.reward, host=a.host, port=a.port, max_batch=a.max_batch,
                          limits=limits)
    print(f"serving reward {a.reward!r} at {server.url}/score", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
