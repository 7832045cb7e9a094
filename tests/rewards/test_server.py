"""Remote reward server over loopback: correct scores, token enforced, bad requests get 4xx with a reason,
and the server keeps serving afterwards.  Every request has a short timeout; counts are small."""
import http.client
import io
import json
import select
import socket
import threading
import time
import zipfile

import numpy as np
import pytest
import torch
from reward_fakes import CALLS

from rewards import RewardSet, build_reward, make_input
from rewards.build import BoundReward
from rewards.http_pool import PooledHTTPServer
from rewards.server import RewardServer, ServerLimits
from rewards.wire import encode_request

TOKEN = "test-token-123"


@pytest.fixture(autouse=True)
def _prompt_shutdown(monkeypatch):
    """The accept loop looks for stop() every 20 ms, not socketserver's 0.5 s: each stop() here waited ~0.5 s of
    wall time for nothing. Serving itself is unchanged (select wakes on a connection either way)."""
    serve = PooledHTTPServer.serve_forever
    monkeypatch.setattr(PooledHTTPServer, "serve_forever", lambda self, poll_interval=0.02: serve(self, poll_interval))


@pytest.fixture
def server():
    reward = build_reward("jpeg_incompressibility", name="jpeg_incompressibility")
    srv = RewardServer(reward, TOKEN, limits=ServerLimits(max_bytes=200_000)).start()
    yield srv
    srv.stop()


def _images(n=3):
    x = torch.rand(n, 3, 24, 24, generator=torch.Generator().manual_seed(0))
    x[0] = 0.5
    return x


def _post(srv, body: bytes, token=TOKEN, headers=None):
    host, port = srv.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=20)
    h = {"Content-Type": "application/x-npz", **({"Authorization": f"Bearer {token}"} if token else {}),
         **(headers or {})}
    conn.request("POST", "/score", body=body, headers=h)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data)


def _remote_set(srv, **kw):
    return RewardSet.from_config({"remote_jpeg": {"reward": "remote", "kwargs": {
        "url": srv.url, "token": TOKEN, "timeout_s": 20, "retries": 1, "backoff_s": 0.01, **kw}}})


def test_scores_match_local(server):
    x = _images()
    batch = make_input(x, ["a", "b", "c"])
    remote = _remote_set(server)(batch).scores[:, 0]
    local = RewardSet.from_config({"jpeg_incompressibility": 1.0})(batch).scores[:, 0]
    torch.testing.assert_close(remote, local)  # uint8 transfer = the reward's own uint8 rounding


def test_token_enforced(server):
    body = encode_request(make_input(_images()))
    assert _post(server, body, token=None)[0] == 401
    status, reply = _post(server, body, token="wrong")
    assert status == 401 and "token" in reply["error"]
    with pytest.raises(Exception, match="refused the request \\(401\\)"):
        RewardSet.from_config({"r": {"reward": "remote", "kwargs": {"url": server.url, "token": "bad",
                                                                     "retries": 0}}})(make_input(_images()))


def test_bad_requests_get_4xx_then_server_still_serves(server):
    status, reply = _post(server, b"x" * 300_000)
    assert status == 413 and "exceeds" in reply["error"]
    status, reply = _post(server, b"not an npz at all")
    assert status == 400 and ".npz" in reply["error"]
    status, _ = _post(server, encode_request(make_input(_images()), "float32")[:-10])  # truncated
    assert status == 400
    buf = io.BytesIO()
    info = np.frombuffer(b'{"prompts": ["a", "b", "c"]}', dtype=np.uint8)
    np.savez(buf, pixels=(_images() * 3).numpy(), group_ids=np.arange(3), info=info)  # outside [0, 1]
    status, reply = _post(server, buf.getvalue())
    assert status == 400 and "[0, 1]" in reply["error"] and "jpeg_incompressibility" in reply["error"]
    buf = io.BytesIO()
    np.savez(buf, pixels=np.zeros((3, 24, 24), np.uint8), group_ids=np.arange(3), info=info)  # no channels
    status, reply = _post(server, buf.getvalue())
    assert status == 400 and "(B, 3, H, W)" in reply["error"]
    buf = io.BytesIO()
    np.savez_compressed(buf, pixels=np.zeros((1000, 3, 64, 64), np.uint8), group_ids=np.arange(1000),
                        info=info)  # ~12 MB of zeros compressed into a small body
    status, reply = _post(server, buf.getvalue())
    assert status == 413 and "unpacks to" in reply["error"]
    assert _post(server, encode_request(make_input(_images())))[0] == 200  # still serving


def test_stop_leaves_no_thread_inside_the_reward(server):
    """stop() joins the connection workers and the batcher: a daemon thread still in torch code when the
    interpreter exits aborts the process ("terminate called without an active exception", rc 134)."""
    assert _post(server, encode_request(make_input(_images())))[0] == 200
    server.stop()
    assert not any(t.is_alive() for t in [*server.httpd.workers, server.batcher.thread])


def test_nan_and_concurrent_requests_are_batched():
    CALLS["sizes"].clear()
    srv = RewardServer(build_reward("reward_fakes:half_nan_reward", name="half"), TOKEN)
    srv.batcher.wait_s = 0.2
    srv.start()
    try:
        results = [None] * 4

        def go(i):
            results[i] = _remote_set(srv)(make_input(torch.full((2, 3, 8, 8), 0.1 * (i + 1))))
        threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
        [t.start() for t in threads]
        [t.join(30) for t in threads]
        assert all(r is not None for r in results)
        assert sum(CALLS["sizes"]) == 8 and len(CALLS["sizes"]) < 4  # requests merged into fewer calls
        for r in results:
            assert r.scores.shape == (2, 1) and r.sub_scores["remote_jpeg/double"].shape == (2,)
        assert sum(torch.isnan(r.scores).sum().item() for r in results) == len(CALLS["sizes"])
    finally:
        srv.stop()


def test_client_retries_on_5xx():
    CALLS["flaky"] = 0
    srv = RewardServer(build_reward("reward_fakes:flaky_reward", name="flaky"), TOKEN).start()
    try:
        out = _remote_set(srv)(make_input(_images(2)))
        torch.testing.assert_close(out.scores[:, 0], torch.full((2,), 7.0))
        assert CALLS["flaky"] == 2
    finally:
        srv.stop()


def test_client_gives_up_on_dead_server():
    srv = RewardServer(build_reward("jpeg_compressibility"), TOKEN)
    url = srv.url
    srv.stop()  # nothing listens on that port now
    rs = RewardSet.from_config({"r": {"reward": "remote", "kwargs": {"url": url, "token": TOKEN, "retries": 1,
                                                                     "backoff_s": 0.01, "timeout_s": 5}}})
    with pytest.raises(Exception, match="failed after 2 attempts"):
        rs(make_input(_images(1)))


def test_server_cli_over_loopback(tmp_path):
    """``python -m rewards.server`` starts, prints its URL, scores a request, and stops on SIGTERM."""
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "FLOWRL_REWARD_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "rewards.server", "--reward", "jpeg_compressibility",
                             "--port", "0", "--device", "cpu"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("serving reward"):
                url = line.split(" at ")[1].strip().removesuffix("/score")
        assert url, "server did not announce its URL"
        rs = RewardSet.from_config({"r": {"reward": "remote", "kwargs": {"url": url, "token": TOKEN, "retries": 0,
                                                                          "timeout_s": 30}}})
        x = _images(2)
        local = RewardSet.from_config({"jpeg_compressibility": 1.0})(make_input(x)).scores
        torch.testing.assert_close(rs(make_input(x)).scores, local)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- faults: every client mistake gets a 4xx with a reason, the server stays bounded and keeps serving ---

def _connect(srv, timeout=20.0) -> socket.socket:
    return socket.create_connection(srv.httpd.server_address[:2], timeout=timeout)


def _reply(sock) -> tuple[int, dict]:
    """Status and JSON body of the one reply on ``sock``."""
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    return resp.status, json.loads(resp.read())


def _raw(srv, data: bytes, half_close: bool = False) -> tuple[int, dict]:
    with _connect(srv) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return _reply(s)


def _head(length: str | None, extra: str = "") -> bytes:
    cl = "" if length is None else f"Content-Length: {length}\r\n"
    return f"POST /score HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n{cl}{extra}\r\n".encode()


@pytest.fixture
def quick():
    """A jpeg reward server with 2 workers and sub-second timeouts, so stalls resolve fast; an idle connection
    leaves its worker after 0.1 s when another connection waits."""
    reward = build_reward("jpeg_incompressibility", name="jpeg_incompressibility")
    limits = ServerLimits(max_bytes=200_000, idle_timeout_s=0.3, read_timeout_s=1.0, workers=2, yield_idle_s=0.1,
                          linger_s=0.5)
    srv = RewardServer(reward, TOKEN, limits=limits).start()
    yield srv
    srv.stop()


def test_listen_backlog_holds_50_connections_before_accept():
    """socketserver's backlog of 5 let 6 of 50 simultaneous connects through; the server listens with 128."""
    srv = RewardServer(build_reward("jpeg_compressibility"), TOKEN)  # listening, not accepting yet
    assert srv.httpd.request_queue_size == 128
    socks = []
    try:
        for _ in range(50):
            socks.append(_connect(srv, timeout=3.0))  # a full queue drops the SYN: connect would time out
            socks[-1].settimeout(20.0)
        srv.start()
        body = encode_request(make_input(_images(1)))
        for s in socks:
            s.sendall(_head(str(len(body))) + body)
        assert [_reply(s)[0] for s in socks] == [200] * 50
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_half_open_connections_time_out_and_threads_stay_bounded(quick):
    before = threading.active_count()
    idle = [_connect(quick) for _ in range(20)]  # connect and say nothing
    try:
        assert threading.active_count() <= before  # 20 connections, no new threads: the pool is fixed
        assert sum(t.name.startswith("reward-http") for t in threading.enumerate()) == 2
        for s in idle:
            assert s.recv(1) == b""  # closed (yielded while others wait, or idle timeout), no reply owed
        assert _post(quick, encode_request(make_input(_images())))[0] == 200
    finally:
        for s in idle:
            s.close()


def test_stalled_requests_get_408(quick):
    with _connect(quick) as s:  # headers started, never finished
        s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
        status, reply = _reply(s)
    assert status == 408 and "not received" in reply["error"]
    body = encode_request(make_input(_images()))
    with _connect(quick) as s:  # body stops half way
        s.sendall(_head(str(len(body))) + body[: len(body) // 2])
        status, reply = _reply(s)
    assert status == 408 and "body not received" in reply["error"]
    with _connect(quick) as s:  # one header byte every 0.2 s: each read is in time, the request is not
        status = None
        for byte in b"POST /score HTTP/1.1\r\nHost: a-slow-client\r\n":
            try:
                s.sendall(bytes([byte]))
            except OSError:
                break
            if select.select([s], [], [], 0.2)[0]:
                break
        status, reply = _reply(s)
    assert status == 408
    assert _post(quick, body)[0] == 200


@pytest.mark.parametrize("length,expect", [("12abc", 400), ("-5", 400), ("\u00b2", 400), ("0x10", 400),
                                           (None, 411), ("99999999999", 413)])
def test_malformed_content_length_gets_a_reason(quick, length, expect):
    status, reply = _raw(quick, _head(length) + b"x" * 20)
    assert status == expect and ("Content-Length" in reply["error"] or "exceeds the limit" in reply["error"])


def test_conflicting_content_lengths_methods_and_garbage_get_4xx(quick):
    status, reply = _raw(quick, _head("5", "Content-Length: 6\r\n") + b"x" * 6)
    assert status == 400 and "Content-Length" in reply["error"]
    status, reply = _raw(quick, b"PUT /score HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert status == 405 and "PUT" in reply["error"]
    status, reply = _raw(quick, b"NOT AN HTTP REQUEST AT ALL\r\n\r\n")
    assert 400 <= status < 500 and reply["error"]
    status, reply = _raw(quick, _head("100") + b"x" * 10, half_close=True)  # client ends the body early
    assert status == 400 and "ended after 10 of 100" in reply["error"]


def test_early_refusal_of_a_large_body_reaches_the_client(quick):
    """A 401 sent before the body is read arrives as a 401, not as a connection reset, because the server
    drains what the client still sends before closing."""
    body = encode_request(make_input(torch.rand(40, 3, 32, 32)))  # ~120 kB: more than the socket buffers take
    status, reply = _post(quick, body, token="wrong")
    assert status == 401 and "token" in reply["error"]


def _bomb(shape=(1000, 3, 64, 64)) -> bytes:
    buf = io.BytesIO()
    info = np.frombuffer(json.dumps({"prompts": ["a"] * shape[0]}).encode(), dtype=np.uint8)
    np.savez_compressed(buf, pixels=np.zeros(shape, np.uint8), group_ids=np.arange(shape[0]), info=info)
    return buf.getvalue()


def _forged_header_npz(shape) -> bytes:
    """An .npz whose pixels header declares ``shape`` while holding 64 bytes: must be refused unread."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": shape})
        zf.writestr("pixels.npy", header.getvalue() + bytes(64))
        for name, arr in (("group_ids", np.arange(1)), ("info", np.frombuffer(b'{"prompts": ["a"]}', np.uint8))):
            member = io.BytesIO()
            np.save(member, arr)
            zf.writestr(f"{name}.npy", member.getvalue())
    return buf.getvalue()


def test_decompression_is_capped_with_413(quick):
    bomb = _bomb()  # 12 MB of zeros in ~12 kB
    assert len(bomb) < 50_000
    status, reply = _post(quick, bomb)
    assert status == 413 and "unpacks to" in reply["error"] and "12288000" in reply["error"]
    status, reply = _post(quick, _forged_header_npz((10**6, 3, 1024, 1024)))  # 3 TB declared: not allocated
    assert status == 413 and "unpacks to" in reply["error"]
    status, reply = _post(quick, _forged_header_npz((1, 3, 8, 8)))  # 192 bytes declared, 64 present
    assert status == 400 and "truncated" in reply["error"]
    with pytest.raises(Exception, match="refused the request \\(413\\)"):
        _remote_set(quick, retries=3)(make_input(torch.rand(100, 3, 32, 32), ["a"] * 100))


def test_decompression_limit_is_separate_from_the_body_limit():
    reward = build_reward("jpeg_incompressibility", name="jpeg_incompressibility")
    srv = RewardServer(reward, TOKEN, limits=ServerLimits(max_bytes=200_000, max_unpacked_bytes=20_000_000))
    srv.start()
    try:
        status, reply = _post(srv, _bomb(shape=(1000, 3, 64, 64)))  # 12 MB unpacked, under 20 MB: scored
        assert status == 200 and len(reply["scores"]["score"]) == 1000
    finally:
        srv.stop()


def test_non_deflate_members_are_refused(quick):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_BZIP2) as zf:
        for name, arr in (("pixels", np.zeros((1, 3, 8, 8), np.uint8)), ("group_ids", np.arange(1)),
                          ("info", np.frombuffer(b'{"prompts": ["a"]}', np.uint8))):
            member = io.BytesIO()
            np.save(member, arr)
            zf.writestr(f"{name}.npy", member.getvalue())
    status, reply = _post(quick, buf.getvalue())
    assert status == 400 and "stored or deflated" in reply["error"]


CALLED = []


def _picky_reward(batch):
    """Refuses (ValueError) any batch holding the prompt "bad"; records each call's prompts."""
    CALLED.append(list(batch.prompts))
    if "bad" in batch.prompts:
        raise ValueError("prompt 'bad' is not one this reward can score")
    return batch.pixels.flatten(1).mean(1)


def _picky_server(**kw):
    return RewardServer(BoundReward(_picky_reward, "picky"), TOKEN, **kw)


def test_rejected_content_is_422_and_never_retried():
    CALLED.clear()
    srv = _picky_server().start()
    try:
        with pytest.raises(Exception, match="refused the request \\(422\\).*not one this reward"):
            _remote_set(srv, retries=3)(make_input(_images(1), ["bad"]))
        assert CALLED == [["bad"]]
    finally:
        srv.stop()


def test_shapes_prompt_outside_the_grammar_and_video_batches_are_4xx():
    srv = RewardServer(build_reward("shapes"), TOKEN).start()
    try:
        status, reply = _post(srv, encode_request(make_input(torch.zeros(1, 3, 32, 32), ["a pink elephant"])))
        assert status == 422 and "not in the shapes grammar" in reply["error"]
        status, reply = _post(srv, encode_request(make_input(torch.zeros(1, 2, 3, 32, 32), ["a red circle"])))
        assert status == 400 and "accepts image" in reply["error"]
    finally:
        srv.stop()


def test_a_bad_request_does_not_fail_the_requests_merged_with_it():
    CALLED.clear()
    srv = _picky_server()
    srv.batcher.wait_s = 0.5  # long enough for the two requests to be merged
    srv.start()
    try:
        bodies = {p: encode_request(make_input(torch.full((1, 3, 8, 8), 0.25), [p]), "float32")
                  for p in ("good", "bad")}
        out = {}
        threads = [threading.Thread(target=lambda p=p: out.setdefault(p, _post(srv, bodies[p]))) for p in bodies]
        [t.start() for t in threads]
        [t.join(30) for t in threads]
        assert out["good"] == (200, {"reward": "picky", "scores": {"score": [0.25]}})
        assert out["bad"][0] == 422
        if len(CALLED[0]) == 2:  # merged: the failed merged call was followed by one call per request
            assert sorted(map(tuple, CALLED[1:])) == [("bad",), ("good",)]
    finally:
        srv.stop()


def test_busy_server_answers_503_when_the_queue_is_full():
    srv = RewardServer(build_reward("jpeg_compressibility"), TOKEN,
                       limits=ServerLimits(workers=1, pending=1, idle_timeout_s=20, yield_idle_s=20)).start()
    held = [_connect(srv)]
    try:
        held[0].sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _reply(held[0])[0] == 200  # the first connection now idles on the only worker (keep-alive)
        held.append(_connect(srv))
        while srv.httpd.pending.qsize() != 1:  # the second one waits in the queue
            time.sleep(0.01)
        with _connect(srv) as s:
            status, reply = _reply(s)
        assert status == 503 and "busy" in reply["error"]
    finally:
        for s in held:
            s.close()
        srv.stop()


def test_client_retries_malformed_http_replies():
    """A peer that answers garbage (http.client.BadStatusLine, not an OSError) is retried, then reported."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen = []

    def garbage():
        while len(seen) < 2:
            conn, _ = listener.accept()
            seen.append(conn.recv(65536))
            conn.sendall(b"NOT HTTP\r\n\r\n")
            conn.close()
    t = threading.Thread(target=garbage, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    rs = RewardSet.from_config({"r": {"reward": "remote", "kwargs": {"url": url, "token": TOKEN, "retries": 1,
                                                                     "backoff_s": 0.01, "timeout_s": 10}}})
    try:
        with pytest.raises(Exception, match="failed after 2 attempts; last: BadStatusLine"):
            rs(make_input(_images(1)))
        assert len(seen) == 2
    finally:
        listener.close()
