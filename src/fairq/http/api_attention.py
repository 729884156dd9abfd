"""Attention domains under ``/v1`` (SPEC §5): declare, publish for a key, plans, states and
tenants of keys, the busiest keys and tenants; the rows of the route table are in
:data:`fairq.http.api.ROUTES`."""

from __future__ import annotations

from ..attention import KeyStats
from ..broker import Broker
from ..errors import InvalidOption
from ..message import check_key, check_name
from . import models as m
from .calls import Call, check_batch, check_wait, infos
from .errors import ApiError


async def attention_info(broker: Broker, name: str) -> m.AttentionInfo:
    a = broker.attention(name)
    config = await a.config()
    return m.AttentionInfo(
        name=name,
        queue=a.queue_name,
        config=m.attention_config(config),
        stats=await a.stats(),
    )


async def list_attention(c: Call) -> m.AttentionList:
    q: m.PrefixQuery = c.query
    names = await c.broker.list_attention(q.prefix)
    return m.AttentionList(await infos(c.broker, names, attention_info))


async def declare_attention(c: Call) -> m.AttentionInfo:
    from ..attention import Plan

    body: m.AttentionOptions = c.body
    plans = None
    if body.plans is not None:
        plans = {
            n: Plan(p.max_concurrency, p.max_messages, p.max_time, p.rate, p.burst, p.weight)
            for n, p in body.plans.items()
        }
    domain = c.path["domain"]
    await c.broker.declare_attention(
        domain,
        plans=plans,
        default_plan=body.default_plan,
        work_queue=body.work_queue,
        queue_options=body.queue_options.to_options() if body.queue_options else None,
        slice_lease=body.slice_lease,
        charge=body.charge,
        shards=body.shards,
    )
    return await attention_info(c.broker, domain)


async def get_attention(c: Call) -> m.AttentionInfo:
    return await attention_info(c.broker, check_name(c.path["domain"], "attention domain"))


async def delete_attention(c: Call) -> None:
    name = c.path["domain"]
    if not await c.broker.delete_attention(name):
        from ..errors import AttentionNotFound

        raise AttentionNotFound(name)


async def reconcile(c: Call) -> m.Reconciled:
    a = c.broker.attention(check_name(c.path["domain"], "attention domain"))
    await a.config()
    return m.Reconciled(await a.reconcile())


async def attention_publish(c: Call) -> m.Ids:
    body: m.SendRequest = c.body
    check_batch(c, len(body.messages))
    check_wait(c, body.timeout)
    a = c.broker.attention(c.path["domain"])
    key = check_key(c.path["key"])
    await a.config()
    return m.Ids(await a.publish_batch(key, [o.to_outgoing() for o in body.messages], body.timeout))


async def set_resource(c: Call) -> KeyStats:
    body: m.ResourceRequest = c.body
    a = c.broker.attention(c.path["domain"])
    key = check_key(c.path["key"])
    config = await a.config()
    if body.plan is not None and body.plan not in config.plans:
        raise InvalidOption(
            f"plan {body.plan!r} is not one of the domain's plans: {', '.join(config.plans)}"
        )
    await a.set_resource(key, plan=body.plan, state=body.state, tenant=body.tenant)
    return await _key_stats(c, key)


async def _key_stats(c: Call, key: str) -> KeyStats:
    a = c.broker.attention(c.path["domain"])
    for k in await a.key_stats(top=1_000_000):
        if k.key == key:
            return k
    raise ApiError(404, "not_found", f"attention domain {a.name!r} has no key {key!r}")


async def get_key(c: Call) -> KeyStats:
    key = check_key(c.path["key"])
    await c.broker.attention(c.path["domain"]).config()
    return await _key_stats(c, key)


async def remove_key(c: Call) -> None:
    q: m.RemoveQuery = c.query
    a = c.broker.attention(c.path["domain"])
    key = check_key(c.path["key"])
    await a.config()
    await a.remove(key, purge=q.purge)


async def key_stats(c: Call) -> m.KeyList:
    q: m.KeysQuery = c.query
    a = c.broker.attention(c.path["domain"])
    return m.KeyList(await a.key_stats(top=q.top))


async def tenant_stats(c: Call) -> m.TenantList:
    q: m.KeysQuery = c.query
    a = c.broker.attention(c.path["domain"])
    return m.TenantList(await a.tenant_stats(top=q.top))
