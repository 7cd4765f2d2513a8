"""The store's put statistics as RocketMQ 4.9.7's StoreStatsService reports them in
GET_BROKER_RUNTIME_INFO (mqadmin brokerStatus): the put latency of the last finished
minute, "null" and 0.00 before the first one ends. Pure arithmetic on a given clock; the
figures right after start were seen side by side with a real 4.9.7 broker (2026-11-27)."""

from __future__ import annotations

from idemp.broker.brokerstats import BrokerStats


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def _distribution(stats: BrokerStats) -> dict[str, int]:
    text = stats.store_info()["putMessageDistributeTime"]
    return {part.split("]:")[0][1:]: int(part.split("]:")[1]) for part in text.split(" ") if part}


def test_the_first_minute_reports_null_and_zero_then_the_minute_before() -> None:
    clock = Clock()
    stats = BrokerStats(clock)
    for elapsed in (0, 1, 9, 10, 49, 50, 10_000):
        stats.on_put(100, elapsed)
    first = stats.store_info()
    assert first["putMessageDistributeTime"] == "null"
    assert (first["putLatency99"], first["putLatency999"]) == ("0.00", "0.00")
    assert first["getTotalTps"] == "0.0 0.0 0.0"  # its windows have too few samples
    assert first["getFoundTps"] == "  "  # the other rates: empty until they have them

    clock.now += 60_001  # the next sampling after a minute rolls the windows over
    stats.sample()
    stats.on_put(100, 3)  # counts in the new minute, not in what is reported
    got = _distribution(stats)
    # setPutMessageEntireTimeMax's ladder: <= 0, < 10, < 50, < 100, ... (10 is not "0~10")
    assert (got["<=0ms"], got["0~10ms"], got["10~50ms"], got["50~100ms"]) == (1, 2, 2, 1)
    assert got["10s~"] == 1 and sum(got.values()) == 7


def test_latency_percentiles_interpolate_inside_their_bucket() -> None:
    clock = Clock()
    stats = BrokerStats(clock)
    for _ in range(100):
        stats.on_put(100, 3)  # all in the (2, 3] ms bucket
    clock.now += 60_001
    stats.sample()
    info = stats.store_info()
    # findPutMessageEntireTimePX: index 99 of 100 in (2, 3]: 2 + 1 * 99 / 100
    assert (info["putLatency99"], info["putLatency999"]) == ("2.99", "2.99")

    one = BrokerStats(clock)
    one.on_put(100, 30)
    clock.now += 60_001
    one.sample()
    # a single put: index int(1 * 0.99) = 0 falls in the first, empty bucket
    assert one.store_info()["putLatency99"] == "0.00"
