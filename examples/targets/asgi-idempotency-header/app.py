"""Smallest FastAPI glue around asgi-idempotency-header 0.2.0: POST /orders inserts one row into
the `orders` table and answers 201 with the created order.

Set up as the library's README shows (Middleware(IdempotencyHeaderMiddleware, backend=RedisBackend(
redis=redis)), every other argument at its default). The only argument given beyond the README's
is the Redis key names of RedisBackend's constructor, so that one run's keys carry a prefix of
their own and can be deleted afterwards; the key layout is otherwise the library's.

Environment: TFV_DATABASE_URL (required), TFV_REDIS_URL, TFV_REDIS_PREFIX.
Run: uvicorn app:app --host 127.0.0.1 --port PORT
"""
import os

import asyncpg
from fastapi import FastAPI, Header
from fastapi.middleware import Middleware
from fastapi.responses import JSONResponse
from pydantic import BaseModel, conint, constr
from redis.asyncio import Redis

from idempotency_header_middleware import IdempotencyHeaderMiddleware
from idempotency_header_middleware.backends import RedisBackend

PREFIX = os.environ.get("TFV_REDIS_PREFIX", "")
redis = Redis.from_url(os.environ.get("TFV_REDIS_URL", "redis://127.0.0.1:6379/12"))
backend = RedisBackend(
    redis=redis,
    keys_key=PREFIX + "idempotency-key-keys",
    response_key=PREFIX + "idempotency-key-responses",
)

app = FastAPI(middleware=[Middleware(IdempotencyHeaderMiddleware, backend=backend)])


class OrderIn(BaseModel):
    item: constr(min_length=1)
    qty: conint(gt=0)


@app.on_event("startup")
async def startup():
    app.state.pool = await asyncpg.create_pool(os.environ["TFV_DATABASE_URL"], min_size=1, max_size=8)


@app.on_event("shutdown")
async def shutdown():
    await app.state.pool.close()


@app.get("/healthz")
async def healthz():
    return {"ok": True}


@app.post("/orders", status_code=201)
async def create_order(
    order: OrderIn,
    authorization: str = Header(None),
    idempotency_key: str = Header(None),
):
    owner = authorization[7:] if authorization and authorization.startswith("Bearer ") else None
    row = await app.state.pool.fetchrow(
        "INSERT INTO orders (item, qty, owner, idempotency_key) VALUES ($1, $2, $3, $4)"
        " RETURNING id, created_at",
        order.item, order.qty, owner, idempotency_key,
    )
    body = {"id": row["id"], "item": order.item, "qty": order.qty, "owner": owner,
            "created_at": row["created_at"].isoformat()}
    return JSONResponse(body, status_code=201, headers={"Location": f"/orders/{row['id']}"})
