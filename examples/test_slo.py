"""SLO tests for a deployment. Run against a URL, or with no URL against a local engine-stub:

    pytest examples/test_slo.py --replay-target "$LLM_URL"
    pytest examples/test_slo.py            # starts engine-stub for the session

Each replay runs open-loop in a child process; failures print the gate table.
"""
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_chat_traffic_meets_slo(replay):
    result = replay("chat", duration=20, rate=1, max_requests=40)
    result.assert_slo(HERE / "slo.yaml")


@pytest.mark.slo("ttft_ms.p99 <= 5000", "error_rate <= 0.01")
def test_bursty_traffic(replay):
    replay("bursty", duration=20, rate=1, max_requests=40)
