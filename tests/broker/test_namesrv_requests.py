"""The nameserver's answers to requests that lack a field, as RocketMQ 4.9.7 gives them.

4.9.7's header decoding catches its own "the custom field <x> is null" and goes on with
the field null, so these requests are served, not refused: a null topic has no route, a
null namespace holds nothing, deleting a null topic deletes nothing. Each case was run
against RocketMQ 4.9.7 (``IDEMP_4X_REAL``) with the same answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemp.broker.process import BrokerProcess
from idemp.remoting import RequestCode, ResponseCode
from tests.broker.rawclient import RawClient
from tests.realbroker import broker_of

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers
FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker of cluster C1 named bx: its name and its cluster's share a bucket of the
    topic list's hash set with SELF_TEST_TOPIC."""
    props = {"brokerClusterName": "C1", "brokerName": "bx"}
    with broker_of(tmp_path_factory.mktemp("ns") / "store", props, HERE) as b:
        yield b


def test_a_route_asked_without_a_topic_is_the_route_of_null(broker: BrokerProcess) -> None:
    with RawClient(broker.namesrv_addr) as ns:
        answer = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {})
    assert (answer.code, answer.remark) == (
        ResponseCode.TOPIC_NOT_EXIST,
        f"No topic route info in name server for the topic: null{FAQ}",
    )


def test_deleting_the_route_of_no_topic_succeeds_and_deletes_nothing(
    broker: BrokerProcess,
) -> None:
    with RawClient(broker.namesrv_addr) as ns:
        answer = ns.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {})
        route = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    assert answer.code == ResponseCode.SUCCESS
    assert route.code == ResponseCode.SUCCESS


def test_a_kv_item_put_without_a_value_is_kept_as_null(broker: BrokerProcess) -> None:
    """RocketMQ's table keeps the null: the namespace exists (its list answers, empty:
    fastjson leaves a null value out), the key reads as no item."""
    with RawClient(broker.namesrv_addr) as ns:
        put = ns.request(RequestCode.PUT_KV_CONFIG, {"namespace": "NullNs", "key": "k"})
        got = ns.request(RequestCode.GET_KV_CONFIG, {"namespace": "NullNs", "key": "k"})
        listed = ns.request(RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "NullNs"})
    assert put.code == ResponseCode.SUCCESS
    assert (got.code, got.remark) == (
        ResponseCode.QUERY_NOT_FOUND,
        "No config item, Namespace: NullNs Key: k",
    )
    assert listed.code == ResponseCode.SUCCESS and json.loads(listed.body) == {"table": {}}


def test_a_missing_namespace_or_key_names_no_item(broker: BrokerProcess) -> None:
    """Not the empty namespace or key: a null one, which no item has."""
    with RawClient(broker.namesrv_addr) as ns:
        item = {"namespace": "", "key": "", "value": "empty"}
        assert ns.request(RequestCode.PUT_KV_CONFIG, item).code == ResponseCode.SUCCESS
        no_key = ns.request(RequestCode.GET_KV_CONFIG, {"namespace": ""})
        no_ns = ns.request(RequestCode.GET_KVLIST_BY_NAMESPACE, {})
        deleted = ns.request(RequestCode.DELETE_KV_CONFIG, {"namespace": ""})
        still = ns.request(RequestCode.GET_KV_CONFIG, {"namespace": "", "key": ""})
    assert (no_key.code, no_key.remark) == (
        ResponseCode.QUERY_NOT_FOUND,
        "No config item, Namespace:  Key: null",
    )
    assert (no_ns.code, no_ns.remark) == (
        ResponseCode.QUERY_NOT_FOUND,
        "No config item, Namespace: null",
    )
    assert deleted.code == ResponseCode.SUCCESS
    assert (still.code, still.ext_fields.get("value")) == (ResponseCode.SUCCESS, "empty")


def test_a_data_version_query_needs_its_body(broker: BrokerProcess) -> None:
    """The body is decoded first (4.9.7: a NullPointerException without one, its text
    not copied here); with one, an address never registered has changed."""
    header = {"brokerAddr": "1.2.3.4:5", "brokerName": "bz", "clusterName": "C2", "brokerId": 0}
    with RawClient(broker.namesrv_addr) as ns:
        bare = ns.request(RequestCode.QUERY_DATA_VERSION, header)
        asked = ns.request(RequestCode.QUERY_DATA_VERSION, header, b"{}")
        no_addr = ns.request(RequestCode.QUERY_DATA_VERSION, {}, b"{}")
    assert bare.code == ResponseCode.SYSTEM_ERROR
    assert (asked.code, asked.ext_fields["changed"]) == (ResponseCode.SUCCESS, "true")
    assert (no_addr.code, no_addr.ext_fields["changed"]) == (ResponseCode.SUCCESS, "true")


def test_cluster_info_has_bare_broker_ids_for_every_client(broker: BrokerProcess) -> None:
    """ClusterInfo.encode() is fastjson's default whatever the client's version; only the
    route answer turns standard for 4.9.4+."""
    with RawClient(broker.namesrv_addr, version=409) as ns:
        body = ns.request(RequestCode.GET_BROKER_CLUSTER_INFO, {}).body.decode()
    assert f'"brokerAddrs":{{0:"{broker.broker_addr}"}}' in body


def test_topic_lists_fill_their_set_in_the_topic_tables_order(broker: BrokerProcess) -> None:
    """C1 and SELF_TEST_TOPIC share a bucket of the answer's hash set, which is filled
    from the nameserver's topic table (a HashMap of 1024 buckets), where C1 comes
    first: so C1 first, whichever registered first. Measured on 4.9.7."""
    expected = [
        "SCHEDULE_TOPIC_XXXX", "bx", "BenchmarkTest", "OFFSET_MOVED_EVENT",
        "C1_REPLY_TOPIC", "TBW102", "C1", "SELF_TEST_TOPIC",
    ]  # fmt: skip
    with RawClient(broker.namesrv_addr) as ns:
        every = ns.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {})
        of_c1 = ns.request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "C1"})
    assert json.loads(every.body)["topicList"] == expected
    assert json.loads(of_c1.body)["topicList"] == expected
