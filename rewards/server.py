"""Serve any registered reward over HTTP, for rewards that need their own process, environment or GPU
(the Flow-GRPO / ddpo-pytorch "reward server" pattern, reference A §2.9).

    python -m rewards.server --reward pickscore --device cuda:1 --port 18085 [--kwargs '{"divisor": 1}']

Binds 127.0.0.1 unless told otherwise; every ``/score`` request must carry ``Authorization: Bearer <token>``
(``--token`` or $FLOWRL_REWARD_TOKEN, else a random one is printed).  Bodies over ``--max-mb`` get 413,
malformed ones 400 with the reason; concurrent requests with the same image shape are scored together, up to
``--max-batch`` samples.  ``GET /health`` needs no token.  Wire format: ``rewards.wire``.
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
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
from torch import Tensor

from rewards.base import RewardError, RewardInput, check_input
from rewards.wire import WireError, decode_request, encode_scores


@dataclass
class _Job:
    batch: RewardInput
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, Tensor] | None = None
    error: str | None = None


class Batcher:
    """One worker thread scoring queued requests; jobs with equal pixel shapes are merged up to max_batch."""

    def __init__(self, reward, max_batch: int = 64, wait_s: float = 0.005):
        self.reward, self.max_batch, self.wait_s = reward, max_batch, wait_s
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="reward-batcher")
        self.thread.start()

    def score(self, batch: RewardInput, timeout: float | None = None) -> dict[str, Tensor]:
        job = _Job(batch)
        self.jobs.put(job)
        if not job.done.wait(timeout):
            raise TimeoutError("reward did not answer in time")
        if job.error is not None:
            raise RuntimeError(job.error)
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

    def _run(self) -> None:
        while True:
            first = self.jobs.get()
            if first is None:
                return
            group = self._gather(first)
            merged = RewardInput(
                pixels=torch.cat([j.batch.pixels for j in group]),
                prompts=[p for j in group for p in j.batch.prompts],
                group_ids=torch.cat([j.batch.group_ids for j in group]),
                meta=[m for j in group for m in (j.batch.meta or [{}] * len(j.batch))],
            )
            try:
                out, start = self.reward(merged), 0
                for j in group:
                    j.result = {k: v[start:start + len(j.batch)] for k, v in out.items()}
                    start += len(j.batch)
            except Exception as e:  # noqa: BLE001 - reported to each waiting request as a 500
                for j in group:
                    j.error = f"{type(e).__name__}: {e}"
            for j in group:
                j.done.set()

    def close(self) -> None:
        self.jobs.put(None)


def _handler(name: str, batcher: Batcher, token: str, max_bytes: int, timeout_s: float):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet by default; errors still reach the client
            pass

        def _send(self, code: int, body: bytes, close: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _error(self, code: int, reason: str, close: bool = False) -> None:
            self._send(code, json.dumps({"error": reason, "reward": name}).encode(), close)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, json.dumps({"reward": name, "ok": True}).encode())
            else:
                self._error(404, f"unknown path {self.path!r}; use POST /score or GET /health")

        def do_POST(self):
            if self.path != "/score":
                return self._error(404, f"unknown path {self.path!r}; use POST /score", close=True)
            auth = self.headers.get("Authorization", "")
            if not hmac.compare_digest(auth.encode(), f"Bearer {token}".encode()):
                return self._error(401, "missing or wrong token (header 'Authorization: Bearer <token>')",
                                   close=True)
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                return self._error(411, "Content-Length header required", close=True)
            if int(length) > max_bytes:
                return self._error(413, f"body of {int(length)} bytes exceeds the limit of {max_bytes}",
                                   close=True)
            try:
                batch = decode_request(self.rfile.read(int(length)), max_unpacked=4 * max_bytes)
                check_input(batch, name)
            except (WireError, RewardError) as e:
                return self._error(400, str(e))
            try:
                scores = batcher.score(batch, timeout=timeout_s)
            except TimeoutError as e:
                return self._error(503, str(e))
            except RuntimeError as e:
                return self._error(500, str(e))
            self._send(200, encode_scores(name, scores))

    return Handler


class RewardServer:
    """A reward behind a ThreadingHTTPServer on ``host:port`` (port 0 = any free port); ``url`` once started."""

    def __init__(self, reward, token: str, name: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 max_bytes: int = 256 << 20, max_batch: int = 64, timeout_s: float = 600.0):
        if not token:
            raise ValueError("a reward server needs a token; pass one or set FLOWRL_REWARD_TOKEN")
        self.name = name or getattr(reward, "name", "reward")
        self.batcher = Batcher(reward, max_batch=max_batch)
        handler = _handler(self.name, self.batcher, token, max_bytes, timeout_s)
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
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


def main(argv: list[str] | None = None) -> None:
    from rewards.build import build_reward

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
    p.add_argument("--max-mb", type=float, default=256)
    a = p.parse_args(argv)
    token = a.token or secrets.token_urlsafe(24)
    if not a.token:
        print(f"FLOWRL_REWARD_TOKEN={token}", flush=True)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {a.host}, reachable beyond this machine; keep the token secret",
              file=sys.stderr)
    reward = build_reward(a.reward, json.loads(a.kwargs), device=a.device, dtype=getattr(torch, a.dtype),
                          batch_size=a.batch_size)
    reward.setup()
    server = RewardServer(reward, token, name=a.reward, host=a.host, port=a.port,
                          max_bytes=int(a.max_mb * (1 << 20)), max_batch=a.max_batch)
    print(f"serving reward {a.reward!r} at {server.url}/score", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
