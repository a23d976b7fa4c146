"""Fixtures of the secure-sum tests: the SecAgg+ schedules every adversary test runs under."""

import pytest

from securefed.securesum.secagg_client import SecAggClient
from securefed.securesum.secagg_server import SecAggServer


@pytest.fixture(params=["construction", "late"])
def schedule(request, monkeypatch):
    """Run a SecAgg+ test under both schedules: input at construction (every stage signs the full spec), and
    input late-bound after the share stage (advertise and share sign the setup part; the input part is bound
    when the client is ready; survivor sets come with every member's input binding). Every SecAggClient and
    SecAggServer built with a full spec in the test — honest or a test's malicious subclass — follows it."""
    monkeypatch.setattr(SecAggClient, "SCHEDULE", request.param)
    monkeypatch.setattr(SecAggServer, "SCHEDULE", request.param)
    return request.param
