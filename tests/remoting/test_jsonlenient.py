"""jsonlenient: fastjson's bare integer map keys, and nothing else changed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idemp.remoting import jsonlenient
from idemp.remoting.jsonlenient import _quote_bare_keys

TRICKY = st.sampled_from(
    ["{1:", ",2:", '{-3 : "x"}', '{0:"127.0.0.1:10911"}', "\\", '"', '\\"{4:', "\n{5:\t", "{}:,"]
)
STRINGS = st.text(max_size=20) | TRICKY | st.lists(TRICKY, max_size=4).map("".join)
INTS = st.integers(-(2**70), 2**70)

JSON_VALUES = st.recursive(
    STRINGS | INTS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(STRINGS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES, st.booleans(), st.sampled_from([None, 1]))
def test_equals_json_loads_on_standard_json(
    value: Any, ascii_only: bool, indent: int | None
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert jsonlenient.loads(text) == json.loads(text)
    assert jsonlenient.loads(text.encode("utf-8")) == json.loads(text)
    # Standard JSON has no bare key, so the quoting pass must leave it untouched.
    assert _quote_bare_keys(text) == text


# fastjson-style documents: maps keyed by ints are written with bare keys.
FASTJSON_VALUES = st.recursive(
    STRINGS | INTS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.integers(-(10**12), 10**12) | STRINGS, inner, max_size=4)
    ),
    max_leaves=20,
)


def fastjson_dumps(value: Any, item_sep: str, key_sep: str) -> str:
    if isinstance(value, dict):
        items = (
            (str(k) if isinstance(k, int) else json.dumps(k))
            + key_sep
            + fastjson_dumps(v, item_sep, key_sep)
            for k, v in value.items()
        )
        return "{" + item_sep.join(items) + "}"
    if isinstance(value, list):
        return "[" + item_sep.join(fastjson_dumps(v, item_sep, key_sep) for v in value) + "]"
    return json.dumps(value)


def standard(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): standard(v) for k, v in value.items()}
    if isinstance(value, list):
        return [standard(v) for v in value]
    return value


@settings(max_examples=200, deadline=None)
@given(FASTJSON_VALUES, st.sampled_from([",", ", ", ",\n  "]), st.sampled_from([":", " : "]))
def test_bare_int_keys(value: Any, item_sep: str, key_sep: str) -> None:
    text = fastjson_dumps(value, item_sep, key_sep)
    assert jsonlenient.loads(text) == standard(value)


def test_bare_keys_exact() -> None:
    assert jsonlenient.loads('{0:"127.0.0.1:10911",-1:"x", 12 :{3:[]}}') == {
        "0": "127.0.0.1:10911",
        "-1": "x",
        "12": {"3": []},
    }
    assert jsonlenient.loads('{"a":"{1:2,3:4}",1:"b","c":[1,2]}') == {
        "a": "{1:2,3:4}",
        "1": "b",
        "c": [1, 2],
    }
    assert jsonlenient.loads(b'{"s":"\\"{7:",8:"\\\\"}') == {"s": '"{7:', "8": "\\"}


@pytest.mark.parametrize("bad", ["{0:}", "{0:1", '{"a":"unterminated', "{a:1}", ""])
def test_invalid_still_raises_value_error(bad: str) -> None:
    with pytest.raises(ValueError):
        jsonlenient.loads(bad)
