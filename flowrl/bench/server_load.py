"""Reward-server load under injected faults: ``run_server_load(connections=50, rounds=5)``.

Starts a ``rewards.server`` on loopback (reward ``jpeg_compressibility`` on 16×16 images, so the server's
connection handling is what is measured) and runs ``rounds`` rounds.  In each round, with the faulty peers
already connected, ``connections`` clients are released together by a barrier and each POSTs one valid
``/score`` request on its own connection.  The faulty peers of a round:

    half_open   connections that connect and send nothing (default connections // 2)
    stalled     5 that send headers and half the body, then stop
    malformed   5 that send a bad Content-Length, a zip bomb, a wrong token, garbage, a short body

Returns ``{"served", "sent", "resets", "refused", "faults"}``: valid requests answered 200 with one score,
valid requests sent, valid requests that met a connection error (reset, refused, closed without a reply) or
a client timeout, valid requests answered with an error status (e.g. 503 when every worker is busy and the
queue is full), and faulty peers injected.  A healthy server has served == sent and resets == 0.
``python -m flowrl.bench.server_load [--connections 50 --rounds 5 --backlog 128]`` prints the dict.
"""
from __future__ import annotations

import argparse
import http.client
import io
import json
import socket
import threading

import numpy as np
import torch

TOKEN = "load-test-token"
CLIENT_TIMEOUT_S = 60.0


def _request(body: bytes, length: str | None = None, token: str = TOKEN) -> bytes:
    length = str(len(body)) if length is None else length
    head = (f"POST /score HTTP/1.1\r\nHost: load\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/x-npz\r\nContent-Length: {length}\r\n\r\n")
    return head.encode() + body


def _zip_bomb() -> bytes:
    buf = io.BytesIO()
    info = np.frombuffer(json.dumps({"prompts": [""] * 2000}).encode(), dtype=np.uint8)
    np.savez_compressed(buf, pixels=np.zeros((2000, 3, 64, 64), np.uint8), group_ids=np.arange(2000), info=info)
    return buf.getvalue()


def _malformed(valid: bytes) -> list[tuple[bytes, bool]]:
    """(bytes to send, half-close after sending) for each malformed peer."""
    return [(_request(valid, length="12abc"), False), (_request(_zip_bomb()), False),
            (_request(valid, token="wrong"), False), (b"NOT HTTP AT ALL\r\n\r\n", False),
            (_request(valid[:100], length=str(len(valid))), True)]


def _valid_client(address, body: bytes, barrier: threading.Barrier, tally: dict, lock: threading.Lock) -> None:
    barrier.wait()
    conn = http.client.HTTPConnection(*address, timeout=CLIENT_TIMEOUT_S)
    outcome = "resets"
    try:
        conn.request("POST", "/score", body=body, headers={"Authorization": f"Bearer {TOKEN}",
                                                            "Content-Type": "application/x-npz"})
        resp = conn.getresponse()
        reply = resp.read()
        if resp.status == 200 and len(json.loads(reply)["scores"]["score"]) == 1:
            outcome = "served"
        else:
            outcome = "refused"
    except (OSError, http.client.HTTPException):  # reset, refused, closed without a reply, timed out
        outcome = "resets"
    finally:
        conn.close()
        with lock:
            tally[outcome] = tally.get(outcome, 0) + 1


def _faulty_peers(address, valid: bytes, half_open: int) -> list[socket.socket]:
    """Connect the round's faulty peers and send their (partial or malformed) bytes; they stay open."""
    peers = []
    full = _request(valid)
    stalled = [(full[: len(full) - len(valid) // 2], False)] * 5
    for data, half_close in [(b"", False)] * half_open + stalled + _malformed(valid):
        try:
            s = socket.create_connection(address, timeout=CLIENT_TIMEOUT_S)
            if data:
                s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            peers.append(s)
        except OSError:
            pass  # the server refused a faulty peer: fine, it only has to serve the valid ones
    return peers


def _round(address, body: bytes, connections: int, half_open: int, tally: dict) -> int:
    lock = threading.Lock()
    peers = _faulty_peers(address, body, half_open)
    barrier = threading.Barrier(connections)
    clients = [threading.Thread(target=_valid_client, args=(address, body, barrier, tally, lock), daemon=True)
               for _ in range(connections)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(CLIENT_TIMEOUT_S * 2)
    for s in peers:
        s.close()
    return len(peers)


def run_server_load(connections: int = 50, rounds: int = 5, half_open: int | None = None, backlog: int = 128,
                    workers: int = 32) -> dict[str, int]:
    """Valid requests served vs sent (and connection errors) with faulty peers holding the server; see module doc.
    The reward server is imported here: the ``flowrl`` package reaches ``rewards`` modules beyond the registry
    only lazily (tests/test_layout.py)."""
    from rewards import build_reward, make_input
    from rewards.server import RewardServer, ServerLimits
    from rewards.wire import encode_request

    if connections < 1 or rounds < 1:
        raise ValueError(f"connections and rounds must be >= 1, got {connections}, {rounds}")
    half_open = connections // 2 if half_open is None else half_open
    limits = ServerLimits(max_bytes=1 << 20, idle_timeout_s=1.0, read_timeout_s=2.0, backlog=backlog,
                          workers=workers, linger_s=0.5)
    server = RewardServer(build_reward("jpeg_compressibility"), TOKEN, limits=limits).start()
    body = encode_request(make_input(torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))))
    tally: dict[str, int] = {}
    faults = 0
    try:
        for _ in range(rounds):
            faults += _round(server.httpd.server_address[:2], body, connections, half_open, tally)
    finally:
        server.stop()
    return {"served": tally.get("served", 0), "sent": connections * rounds, "resets": tally.get("resets", 0),
            "refused": tally.get("refused", 0), "faults": faults}


def main(argv: list[str] | None = None) -> dict[str, int]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--half-open", type=int, default=None)
    ap.add_argument("--backlog", type=int, default=128)
    ap.add_argument("--workers", type=int, default=32)
    a = ap.parse_args(argv)
    return run_server_load(a.connections, a.rounds, a.half_open, a.backlog, a.workers)


if __name__ == "__main__":
    print(json.dumps(main()))
