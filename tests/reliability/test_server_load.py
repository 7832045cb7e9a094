"""Reward server under load with injected faults (issue #16 item 5): 50 parallel connections × 5 rounds, each
round with half-open, stalled and malformed peers holding the server; every valid request must be served.

The load generator is ``flowrl.bench.server_load`` (also used by ``bench.py reliability``)."""
import pytest

from flowrl.bench import server_load


def _load_module():
    return server_load


@pytest.mark.slow
def test_every_request_served_under_faulty_load():
    out = _load_module().run_server_load(connections=50, rounds=5)
    assert out["sent"] == 250 and out["faults"] > 0
    assert out["served"] == out["sent"], out
    assert out["resets"] == 0 and out["refused"] == 0, out


def test_load_generator_rejects_bad_sizes():
    with pytest.raises(ValueError, match="connections and rounds"):
        _load_module().run_server_load(connections=0)
