"""The Prometheus endpoint binds loopback unless told otherwise, and the run's endpoint is where its config says
(`buffer.metrics_port`, `buffer.metrics_host`; the port range-checked)."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from pydantic import ValidationError

from buffer.cli import main
from buffer.monitor import serve_configured_metrics, serve_metrics
from buffer.redis_buffer import ReplayBuffer
from buffer.settings import BufferConfig
from config import ConfigError, load_config
from tests.timing import scaled


def _this_machines_address() -> str | None:
    """An address of this machine that is not loopback (the interface a default route leaves by), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # UDP: picks the route's source address, sends nothing
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def buffer(redis_url):
    buf = ReplayBuffer(redis_url, "metrics")
    buf.publish_version(3)
    yield buf
    buf.close()


def test_the_endpoint_binds_loopback_by_default(buffer):
    served = serve_metrics(buffer, 0)  # 0: a free port
    try:
        assert served.server.server_address[0] == "127.0.0.1" and served.host == "127.0.0.1"
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{served.port}/metrics", timeout=scaled(5))
            .read()
            .decode()
        )
        assert "sr1_buffer_version 3.0" in body
        other = _this_machines_address()
        if other is not None:  # the machine's own network address does not reach it
            assert not _answers(other, served.port)
    finally:
        served.close()


def test_the_runs_endpoint_is_on_buffer_metrics_host_and_port(buffer, free_port):
    assert serve_configured_metrics(buffer, BufferConfig()) is None  # no port: no endpoint
    served = serve_configured_metrics(buffer, BufferConfig(metrics_port=free_port))
    try:
        assert (served.host, served.port) == ("127.0.0.1", free_port)
        assert (
            "sr1_buffer_version 3.0"
            in urllib.request.urlopen(f"http://127.0.0.1:{free_port}/metrics").read().decode()
        )
    finally:
        served.close()
    served = serve_configured_metrics(buffer, BufferConfig(metrics_port=0, metrics_host="0.0.0.0"))
    try:
        assert served.server.server_address[0] == "0.0.0.0" and served.port > 0  # every interface, when asked
    finally:
        served.close()


def test_an_address_that_cannot_be_bound_names_the_settings(buffer):
    with pytest.raises(OSError, match=r"buffer.metrics_host='192.0.2.1' buffer.metrics_port=0"):
        serve_configured_metrics(buffer, BufferConfig(metrics_port=0, metrics_host="192.0.2.1"))  # not ours


@pytest.mark.parametrize("port", [-1, 65536])
def test_the_port_is_range_checked(port):
    with pytest.raises(ValidationError, match="metrics_port"):
        BufferConfig(metrics_port=port)
    with pytest.raises(ConfigError, match="buffer.metrics_port"):
        load_config("tiny", [f"buffer.metrics_port={port}"])


def test_a_namespace_that_is_no_plain_key_prefix_is_refused():
    """The namespace is the ACL key pattern `<namespace>:*` of the run's Redis user: a glob character would open
    other keys, a space would break the ACL file."""
    for bad in ("run*", "a b", "x[1]"):
        with pytest.raises(ConfigError, match="buffer.namespace"):
            load_config("tiny", [f"buffer.namespace={bad}"])
    assert load_config("tiny", ["buffer.namespace=team-a:run.7"]).buffer.namespace == "team-a:run.7"


def test_sr1_buffer_serves_loopback_unless_told(redis_url, free_port, capsys, monkeypatch):
    ReplayBuffer(redis_url, "cli").publish_version(1)
    served = []
    monkeypatch.setattr("buffer.cli.serve_metrics", lambda *a: served.append(serve_metrics(*a)) or served[-1])
    assert (
        main(["watch", "--once", "--url", redis_url, "--namespace", "cli", "--metrics-port", str(free_port)])
        == 0
    )
    assert served[-1].server.server_address[0] == "127.0.0.1"
    served[-1].close()
    argv = ["watch", "--once", "--url", redis_url, "--namespace", "cli", "--metrics-port", "0"]
    assert main([*argv, "--metrics-host", "0.0.0.0"]) == 0
    assert served[-1].server.server_address[0] == "0.0.0.0"
    served[-1].close()
