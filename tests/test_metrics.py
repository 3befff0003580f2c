"""The statsd sink on a real loopback UDP socket: every metric arrives whatever the packet size,
no datagram exceeds it, and a sink whose receiver never reads never blocks the sender."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from zephon._engine.stats import OpStats, RunStats
from zephon.errors import ConfigError
from zephon.io import SourceStats
from zephon.metrics import MetricsReporter, StatsdSink, metric_values, parse_address


def snapshot(operators: int) -> RunStats:
    ops = [
        OpStats(name=f"op{i}", elements_in=i, worker_ns=i * 1_000_000, bytes_fetched=7 * i)
        for i in range(operators)
    ]
    io = SourceStats(bytes_fetched=123, requests=4, retries=1, cache_hits=2)
    return RunStats(delivered=10, samples_read=12, io=io, operators=ops)


@pytest.fixture
def receiver() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(30)
    yield sock
    sock.close()


def receive(sock: socket.socket, count: int) -> tuple[dict[str, str], list[int]]:
    lines: dict[str, str] = {}
    sizes: list[int] = []
    while len(lines) < count:
        data = sock.recv(65536)
        sizes.append(len(data))
        for line in data.decode().splitlines():
            name, _, value = line.partition(":")
            lines[name] = value
    return lines, sizes


@pytest.mark.parametrize("packet", [64, 512, 60_000])
def test_every_metric_arrives_in_datagrams_of_at_most_the_packet_size(
    receiver: socket.socket, packet: int
) -> None:
    stats = snapshot(40)
    expected = dict(metric_values(stats))
    sink = StatsdSink(*receiver.getsockname(), prefix="t", max_packet_bytes=packet)
    assert sink.emit(stats) == len(expected)
    got, sizes = receive(receiver, len(expected))
    sink.close()
    assert got == {f"t.{k}": f"{v}|g" for k, v in expected.items()}
    assert max(sizes) <= packet and (len(sizes) > 1) == (packet < 60_000)
    assert got["t.io.bytes_fetched"] == "123|g" and got["t.op.3_op3.worker_ms"] == "3.0|g"


def test_a_receiver_that_never_reads_never_blocks_the_sender(receiver: socket.socket) -> None:
    """Far more than the socket buffers hold: the surplus is dropped, emit returns."""
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sink = StatsdSink(*receiver.getsockname(), max_packet_bytes=60_000)
    stats = snapshot(2000)
    for _ in range(5):
        sink.emit(stats)
    sink.close()


def test_reporter_pushes_the_last_snapshot_on_close(receiver: socket.socket) -> None:
    stats = snapshot(1)
    reporter = MetricsReporter(
        lambda: stats, [StatsdSink(*receiver.getsockname(), prefix="r")], interval_s=3600
    )
    reporter.close()
    got, _ = receive(receiver, len(dict(metric_values(stats))))
    assert got["r.delivered"] == "10|g"


def test_bad_settings_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match=r"expected HOST:PORT"):
        parse_address("localhost:http")
    assert parse_address("example.org") == ("example.org", 8125)
    with pytest.raises(ConfigError, match=r"max_packet_bytes must be >= 64"):
        StatsdSink(max_packet_bytes=10)


def test_a_mixture_is_sent_per_dataset_with_safe_names(receiver: socket.socket) -> None:
    from zephon.work import MixtureStats

    target = MixtureStats.target(["web text", "code"], {"web text": 0.7, "code": 0.3}, "samples")
    stats = RunStats(delivered=10, mixture=target.counted([7, 3], [140, 300]))
    sink = StatsdSink(*receiver.getsockname(), prefix="t")
    expected = dict(metric_values(stats))
    sink.emit(stats)
    got, _ = receive(receiver, len(expected))
    sink.close()
    assert got["t.mixture.web_text.weight"] == "0.7|g"
    assert got["t.mixture.code.samples"] == "3|g" and got["t.mixture.code.tokens"] == "300|g"
    assert got["t.mixture.web_text.sample_share"] == "0.7|g"
    assert got["t.mixture.web_text.token_share"] == f"{round(140 / 440, 6)}|g"
    nothing = RunStats(mixture=target)  # no share before anything is delivered
    assert not [k for k, _ in metric_values(nothing) if k.endswith("_share")]
