"""``/openapi.json`` and ``docs/http-api.md``, both generated from the route table.

:func:`openapi` walks :data:`fairq.http.api.ROUTES` and asks msgspec for the JSON
Schema of every model a route names, so the document describes exactly what the server
decodes and encodes. :func:`markdown` renders the same document as the API reference
page; ``python -m fairq.http.openapi > docs/http-api.md`` rewrites it, and a test checks
the committed page is current.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import msgspec

from .. import __version__
from . import models as m
from .api import PATH_PARAMS, ROUTES, Limits, Route
from .errors import PROTOCOL_ERRORS
from .waiting import may_wait

__all__ = ["markdown", "openapi"]

_REF = "#/components/schemas/{name}"
_STATUS_TEXT = {
    200: "OK",
    204: "No Content",
    400: "Malformed request (bad JSON, bad name or receipt)",
    401: "No API key, or an unknown one",
    403: "The API key lacks the scope",
    404: "No such queue, topic, domain, subscription, key, room or route",
    409: "Conflicts with the current state (lease lost, option that cannot change)",
    413: "Request body or message too large",
    422: "Well-formed but not acceptable (schema, option or filter)",
    429: "A bounded queue is full; retry later",
    503: "Too many requests wait at once (streams, long polls, blocked sends); retry later",
}
_SCOPE_TEXT = {
    "admin": "`admin`",
    "send": "`send`",
    "receive": "`receive`",
    "read": "any key",
    "public": "none",
}
_TAGS = {
    "queues": "Durable work queues: send, receive under a lease, ack, dead letters.",
    "topics": "Publish/subscribe: subscriptions are queues; streams are ephemeral.",
    "attention": "Attention domains: fair on-demand consumption of many per-key queues.",
    "rooms": "Waiting rooms: set-up and admission control, and fans joined by your app.",
    "idempotency": "Idempotency keys (claim, complete, release) and version gates.",
    "dashboard": "What the dashboard shows: the sampler's rates and history.",
    "server": "Health and metrics.",
}


_IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "a unique value per operation (a UUID fits), repeated on every retry",
    "schema": {"type": "string", "pattern": m.KEY_PATTERN},
}
_IDEMPOTENT_TEXT = (
    "With an `Idempotency-Key` header (SPEC §7) the first request runs and its answer is "
    "kept for 24 h (except a 429 or 503, which stored nothing): a repeat with the same "
    "key and the same request (method, path, body) gets that answer again with "
    "`Idempotent-Replayed: true`; the same key with a different request answers 422 "
    "`idempotency_key_reused`, and while the first still runs 409 `idempotency_key_in_use` "
    "(with `Retry-After`). Keys belong to the API key that sent them."
)


def _query_parameters(query: type) -> list[dict[str, Any]]:
    schema = msgspec.json.schema(query)
    defs = schema.get("$defs", {})
    body = defs.get(query.__name__, schema)
    required = set(body.get("required", ()))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": prop}
        for name, prop in body.get("properties", {}).items()
    ]


def _body_required(model: type) -> bool:
    fields = msgspec.structs.fields(model)
    return any(f.required for f in fields)


def _operation(route: Route, auth: bool) -> dict[str, Any]:
    params: list[dict[str, Any]] = []
    for name in route.path_params:
        what, pattern = PATH_PARAMS[name]
        params.append(
            {
                "name": name,
                "in": "path",
                "required": True,
                "description": what,
                "schema": {"type": "string", "pattern": pattern},
            }
        )
    if route.query is not None:
        params.extend(_query_parameters(route.query))
    if route.idempotent:
        params.append(_IDEMPOTENCY_KEY)
    scope = {"read": "any valid key", "public": "none, no key needed"}.get(
        route.scope, f"`{route.scope}` (or `admin`)"
    )
    description = route.description
    if route.idempotent:
        description = f"{description}\n\n{_IDEMPOTENT_TEXT}".strip()
    if auth:
        description = f"{description}\n\nScope: {scope}.".strip()
    op: dict[str, Any] = {
        "operationId": route.op,
        "tags": [route.tag],
        "summary": route.summary,
        "x-fairq-scope": route.scope,
    }
    if description:
        op["description"] = description
    if params:
        op["parameters"] = params
    errors = set(route.errors)
    if route.body is not None:
        op["requestBody"] = {
            "required": _body_required(route.body),
            "content": {
                "application/json": {"schema": {"$ref": _REF.format(name=route.body.__name__)}}
            },
        }
        errors |= {400, 413, 422}
    if route.query is not None:
        errors |= {422}
    if route.path_params:
        errors |= {400}
    if may_wait(route.stream, route.body):
        errors |= {503}
    secured = auth and route.scope != "public"
    if secured:
        errors |= {401, 403}
    responses: dict[str, Any] = {}
    if route.stream:
        responses["200"] = {
            "description": "An event stream (see the description)",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    elif route.response is None:
        responses[str(route.status)] = {"description": _STATUS_TEXT[route.status]}
    else:
        media = "text/plain" if route.response is str else "application/json"
        schema = (
            {"type": "string"}
            if route.response is str
            else {"$ref": _REF.format(name=route.response.__name__)}
        )
        responses[str(route.status)] = {
            "description": _STATUS_TEXT[route.status],
            "content": {media: {"schema": schema}},
        }
    if route.idempotent:
        responses[str(route.status)]["headers"] = {
            "Idempotent-Replayed": {
                "description": "`true` on a replayed answer",
                "schema": {"type": "string", "enum": ["true"]},
            }
        }
    error = {"schema": {"$ref": _REF.format(name="Error")}}
    for status in sorted(errors):
        content = {"application/json": error}
        if route.idempotent and status in (400, 409, 422):
            # the middleware's answers about the key are problem details (RFC 9457)
            content["application/problem+json"] = error
        responses[str(status)] = {"description": _STATUS_TEXT[status], "content": content}
    op["responses"] = responses
    if auth:
        op["security"] = [{"bearer": []}, {"apiKey": []}] if secured else []
    return op


def _apply_limits(node: Any, limits: Limits) -> None:
    if isinstance(node, dict):
        name = node.pop("x-fairq-limit", None)
        if name is not None:
            value = limits.value(name)
            if node.get("type") == "array":
                node["maxItems"] = int(value)
            elif node.get("type") == "integer":
                node["maximum"] = int(value)
            else:
                node["maximum"] = value
        for child in node.values():
            _apply_limits(child, limits)
    elif isinstance(node, list):
        for child in node:
            _apply_limits(child, limits)


def openapi(limits: Limits | None = None, auth: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API served with ``limits`` (and API keys if
    ``auth``)."""
    limits = limits or Limits()
    models: list[Any] = [m.Error]
    for r in ROUTES:
        if r.body is not None:
            models.append(r.body)
        if r.response is not None and r.response is not str:
            models.append(r.response)
    _, components = msgspec.json.schema_components(models, ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r, auth)
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "fairq",
            "version": __version__,
            "description": (
                "The REST API of `fairq serve`: queues, topics, attention domains, waiting "
                "rooms, idempotency keys and version gates. "
                'Errors are `{"error": code, "detail": text}`; codes: '
                + ", ".join(
                    f"`{c}` ({s})"
                    for c, s in sorted({**PROTOCOL_ERRORS, **_library_codes()}.items())
                )
                + "."
            ),
        },
        "tags": [{"name": n, "description": d} for n, d in _TAGS.items()],
        "paths": paths,
        "components": {"schemas": components},
    }
    if auth:
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
    _apply_limits(doc, limits)
    return doc


def _library_codes() -> dict[str, int]:
    from .errors import ERRORS

    return {v.code: v.status for v in ERRORS.values() if v.status != 500}


# -- the reference page --------------------------------------------------------------------
def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " \\| ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{v!r}`".replace("'", '"') for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"object of {_type(extra)}" if isinstance(extra, dict) and extra else "object"
    if kind is None:
        return "any JSON"
    return str(kind)


def _constraints(schema: dict[str, Any]) -> str:
    parts = []
    for key, text in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
        ("minProperties", "entries ≥"),
        ("maxProperties", "entries ≤"),
    ):
        if key in schema:
            parts.append(
                f"{text} {schema[key]:g}"
                if isinstance(schema[key], float)
                else f"{text} {schema[key]}"
            )
    if "pattern" in schema:
        parts.append(f"pattern `{schema['pattern']}`")
    for sub in schema.get("anyOf", []):
        c = _constraints(sub)
        if c:
            parts.append(c)
    return ", ".join(parts)


def _fields(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties", {})
    if not props:
        return []
    required = set(schema.get("required", []))
    lines = ["| field | type | default | constraints |", "|---|---|---|---|"]
    for name, prop in props.items():
        default = (
            "required"
            if name in required
            else (
                f"`{msgspec.json.encode(prop['default']).decode()}`" if "default" in prop else "—"
            )
        )
        lines.append(f"| `{name}` | {_type(prop)} | {default} | {_constraints(prop)} |")
    return lines


def markdown(doc: dict[str, Any] | None = None) -> str:
    """The API reference page (``docs/http-api.md``) of ``doc`` (default: the server's
    document with API keys and default limits)."""
    doc = doc or openapi(auth=True)
    out = [
        "# HTTP API reference",
        "",
        "<!-- generated by `python -m fairq.http.openapi > docs/http-api.md`; "
        "do not edit by hand -->",
        "",
        "The REST API of `fairq serve` (see [server.md](server.md)), generated from the "
        "same route table and models as the server's `/openapi.json`. Every request body "
        'and answer is JSON; errors are `{"error": code, "detail": text}`. With API '
        "keys set, send `Authorization: Bearer KEY`; each operation names the scope it "
        "needs (`admin` holds every scope).",
        "",
        doc["info"]["description"],
        "",
        "| method | path | scope | what it does |",
        "|---|---|---|---|",
    ]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            anchor = op["operationId"].lower()
            out.append(
                f"| {method.upper()} | [`{path}`](#{anchor}) | "
                f"{_SCOPE_TEXT[op['x-fairq-scope']]} | "
                f"{op['summary']} |"
            )
    for tag in doc["tags"]:
        out += ["", f"## {tag['name']}", "", tag["description"]]
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                if op["tags"] != [tag["name"]]:
                    continue
                out += [
                    "",
                    f"### {op['operationId']}",
                    "",
                    f"`{method.upper()} {path}` — {op['summary']}. "
                    f"Scope: {_SCOPE_TEXT[op['x-fairq-scope']]}.",
                ]
                desc = re.sub(r"\s*Scope: .*$", "", op.get("description", "")).strip()
                if desc:
                    out += ["", desc]
                query = [p for p in op.get("parameters", []) if p["in"] == "query"]
                if query:
                    out += ["", "Query parameters:", ""]
                    out += _fields({"properties": {p["name"]: p["schema"] for p in query}})
                body = op.get("requestBody")
                if body is not None:
                    ref = body["content"]["application/json"]["schema"]["$ref"]
                    out += [
                        "",
                        f"Body: {_type({'$ref': ref})}"
                        + ("" if body["required"] else " (optional)"),
                    ]
                answers = []
                for status, resp in op["responses"].items():
                    content = resp.get("content", {})
                    kinds = [
                        _type(c["schema"]) if media == "application/json" else f"`{media}`"
                        for media, c in content.items()
                    ]
                    if int(status) < 400:
                        answers.append(f"{status} {', '.join(kinds) or '(no body)'}")
                    else:
                        answers.append(status)
                out += ["", "Answers: " + "; ".join(answers) + "."]
    out += ["", "## Models"]
    for name, schema in doc["components"]["schemas"].items():
        out += ["", f"### {name}"]
        if "description" in schema:
            out += ["", " ".join(schema["description"].replace("``", "`").split())]
        fields = _fields(schema)
        if fields:
            out += ["", *fields]
    return "\n".join(out) + "\n"


def main() -> None:
    """``python -m fairq.http.openapi [--json]``: print the reference page (or the JSON)."""
    if "--json" in sys.argv[1:]:
        sys.stdout.write(msgspec.json.encode(openapi()).decode() + "\n")
    else:
        sys.stdout.write(markdown())


if __name__ == "__main__":  # pragma: no cover
    main()
