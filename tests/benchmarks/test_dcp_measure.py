"""``flowrl.bench.dcp_measure.measure(quick=True)``: a run check of the sharded-checkpoint benchmark (four
launches of 1–2 CPU processes, slow). On the tiny preset the save peaks are noise (a few MB), so only the shape of
the result and the bitwise resume checks are asserted; the memory figure is the full run's (docs/training.md)."""
import pytest

pytestmark = pytest.mark.slow


def test_quick_measure_reports_the_ratio_and_bitwise_resume():
    from flowrl.bench.dcp_measure import measure

    result = measure(quick=True)
    assert set(result) == {"dcp_save_peak_ratio", "dcp_resume_bitwise"}
    assert isinstance(result["dcp_save_peak_ratio"], float) and result["dcp_save_peak_ratio"] > 0
    assert result["dcp_resume_bitwise"] == {"1": True, "2": True}
