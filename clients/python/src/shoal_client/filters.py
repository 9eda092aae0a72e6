"""Filters as dicts, in the JSON form of docs/filters.md, as the wire's
`shoal.v1.Filter`:

    {"must": [{"key": "tags", "match": "django"},
              {"key": "rand", "range": {"gte": 10, "lt": 500}}],
     "should": [{"key": "lang", "any": ["en", "de"]}],
     "must_not": [{"has_id": [7, 9]}, {"key": "title", "is_empty": True}]}

A mistake in the form is an InvalidArgument naming its place in the
filter (``filter must[0].range: ...``) before anything is sent; the
coordinator checks the rest (fields without an index, values of the wrong
type) and names the place the same way.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping

from ._proto.shoal.v1 import common_pb2
from .errors import InvalidArgument

#: What a payload index holds, by name.
FIELD_TYPES = {
    "keyword": common_pb2.KEYWORD,
    "integer": common_pb2.INTEGER,
    "float": common_pb2.FLOAT,
    "bool": common_pb2.BOOL,
    "datetime": common_pb2.DATETIME,
}


def _err(path: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"filter {path or '(top)'}: {why}")


def to_proto(f: Mapping[str, Any]) -> common_pb2.Filter:
    """The wire form of a filter dict."""
    return _filter(f, "")


def _filter(f: Any, path: str) -> common_pb2.Filter:
    if not isinstance(f, Mapping):
        raise _err(path, "must be a dict with must, should and must_not lists")
    out = common_pb2.Filter()
    for clause, items in f.items():
        if clause not in ("must", "should", "must_not"):
            raise _err(path, f"unknown clause {clause!r}: a filter holds must, should and must_not")
        if not isinstance(items, (list, tuple)):
            raise _err(f"{path}.{clause}".lstrip("."), "must be a list of conditions")
        target = getattr(out, clause)
        for i, c in enumerate(items):
            target.append(_condition(c, f"{path}.{clause}[{i}]".lstrip(".")))
    return out


def _condition(c: Any, path: str) -> common_pb2.Condition:
    if not isinstance(c, Mapping):
        raise _err(path, "must be a dict")
    if any(k in c for k in ("must", "should", "must_not")):
        return common_pb2.Condition(filter=_filter(c, path))
    if "has_id" in c:
        ids = c["has_id"]
        if len(c) != 1 or not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise _err(f"{path}.has_id", "must stand alone and be a list of point ids (unsigned integers)")
        return common_pb2.Condition(has_id=common_pb2.HasId(ids=list(ids)))
    key = c.get("key")
    if not isinstance(key, str):
        raise _err(path, "expected key with match, any, range or is_empty; has_id; or a nested must/should/must_not")
    ops = [k for k in c if k != "key"]
    if len(ops) != 1:
        raise _err(path, f"needs exactly one of match, any, range, is_empty beside key, got {ops}")
    op, arg = ops[0], c[ops[0]]
    place = f"{path}.{op}"
    fc = common_pb2.FieldCondition(key=key)
    if op == "match":
        fc.match.CopyFrom(_value(arg, place))
    elif op == "any":
        if not isinstance(arg, (list, tuple)):
            raise _err(place, "must be a list of values")
        fc.any.CopyFrom(common_pb2.MatchAny(values=[_value(v, f"{place}[{i}]") for i, v in enumerate(arg)]))
    elif op == "range":
        fc.range.CopyFrom(_range(arg, place))
    elif op == "is_empty":
        if not isinstance(arg, bool):
            raise _err(place, "must be True or False")
        fc.is_empty = arg
    else:
        raise _err(path, f"unknown operator {op!r}: expected match, any, range or is_empty")
    return common_pb2.Condition(field=fc)


def _value(v: Any, place: str) -> common_pb2.MatchValue:
    if isinstance(v, bool):
        return common_pb2.MatchValue(boolean=v)
    if isinstance(v, int):
        return common_pb2.MatchValue(integer=v)
    if isinstance(v, str):
        return common_pb2.MatchValue(keyword=v)
    raise _err(place, "must be a keyword, an integer or a boolean")


def _range(r: Any, place: str) -> common_pb2.Range:
    if not isinstance(r, Mapping):
        raise _err(place, "must be a dict of gt, gte, lt, lte")
    out = common_pb2.Range()
    for name, b in r.items():
        if name not in ("gt", "gte", "lt", "lte"):
            raise _err(place, f"unknown bound {name!r}: expected gt, gte, lt or lte")
        bound = getattr(out, name)
        if isinstance(b, bool):
            raise _err(f"{place}.{name}", "must be a number or an RFC 3339 time")
        if isinstance(b, int):
            bound.integer = b
        elif isinstance(b, float) and math.isfinite(b):
            bound.number = b
        elif isinstance(b, str):
            bound.datetime = b
        else:
            raise _err(f"{place}.{name}", "must be a finite number or an RFC 3339 time")
    return out


def field_type(name: str) -> int:
    if name not in FIELD_TYPES:
        raise InvalidArgument(f"field type {name!r}: expected one of {sorted(FIELD_TYPES)}")
    return FIELD_TYPES[name]


def explain_of(shards: Any) -> List[Dict[str, Any]]:
    """Each shard's plan as a dict: shard, node, plan, matches,
    matches_exact, compared."""
    return [
        {
            "shard": s.shard,
            "node": s.node,
            "plan": s.explain.plan,
            "matches": s.explain.matches,
            "matches_exact": s.explain.matches_exact,
            "compared": s.explain.compared,
        }
        for s in shards
    ]
