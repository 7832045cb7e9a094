"""Remote reward server over loopback: correct scores, token enforced, bad requests get 4xx with a reason,
and the server keeps serving afterwards.  Every request has a short timeout; counts are small."""
import http.client
import io
import json
import threading

import numpy as np
import pytest
import torch
from reward_fakes import CALLS

from rewards import RewardSet, build_reward, make_input
from rewards.server import RewardServer
from rewards.wire import encode_request

TOKEN = "test-token-123"


@pytest.fixture
def server():
    reward = build_reward("jpeg_incompressibility", name="jpeg_incompressibility")
    srv = RewardServer(reward, TOKEN, max_bytes=200_000).start()
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
    assert status == 400 and "unpacks to" in reply["error"]
    assert _post(server, encode_request(make_input(_images())))[0] == 200  # still serving


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
