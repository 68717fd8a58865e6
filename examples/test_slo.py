"""SLO tests for a deployment. Run against a URL, or with no URL against a local engine-stub:

    pytest examples/test_slo.py --replay-target "$LLM_URL"
    pytest examples/test_slo.py            # starts engine-stub for the session

Each replay runs open-loop in a child process; failures print the gate table (and, when
requests failed, their status counts and first errors). Every preset fits engine-stub's
default 8192-token context. A p99 needs 100 samples and a p95 20 (`min_tail_samples`):
these short runs gate p95; gate p99 on runs of 100+ requests.
"""
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_chat_traffic_meets_slo(replay):
    result = replay("chat", duration=15, rate=2, max_requests=40)
    result.assert_slo(HERE / "slo.yaml")


@pytest.mark.slo("ttft_ms.p95 <= 5000", "error_rate <= 0.01")
def test_bursty_traffic(replay):
    replay("bursty", duration=15, rate=3, max_requests=40)
