"""Smallest Django glue around django-idempotency-key 1.3.0: POST /orders inserts one row into
the `orders` table and answers 201 with the created order.

Configuration follows the library's README: IdempotencyKeyMiddleware (every unsafe method needs
an Idempotency-Key), CacheKeyStorage on a Django cache -- here Django's DatabaseCache, so the
keys live in a PostgreSQL table -- and MultiProcessRedisLock, the lock the README names for
more than one process. Everything else is the library's and Django's default.

Environment: TFV_PGDATABASE (required unless TFV_DATABASE_URL), TFV_PGHOST/TFV_PGPORT/TFV_PGUSER,
or TFV_DATABASE_URL (postgresql://user[:password]@host:port/db, which wins: the interposed
scenarios hand the service the URL of the runner's interposer), TFV_REDIS_URL, TFV_LOCK_NAME.
Run: gunicorn app:application   |   python app.py createcachetable
"""
import json
import os
import sys

from urllib.parse import unquote, urlsplit

import django
from django.conf import settings


def database_settings():
    """Django's DATABASES entry from TFV_DATABASE_URL when set, else from the TFV_PG* variables."""
    url = os.environ.get("TFV_DATABASE_URL")
    if not url:
        return {
            "NAME": os.environ["TFV_PGDATABASE"],
            "HOST": os.environ.get("TFV_PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("TFV_PGPORT", "5432"),
            "USER": os.environ.get("TFV_PGUSER", "postgres"),
        }
    u = urlsplit(url)
    if u.scheme not in ("postgres", "postgresql") or not u.path.strip("/"):
        sys.exit(f"TFV_DATABASE_URL must be postgresql://user@host:port/database, got scheme {u.scheme!r}")
    return {
        "NAME": unquote(u.path.lstrip("/")),
        "HOST": u.hostname or "127.0.0.1",
        "PORT": str(u.port or 5432),
        "USER": unquote(u.username or "postgres"),
        "PASSWORD": unquote(u.password or ""),
    }


settings.configure(
    DEBUG=False,
    USE_TZ=True,  # Django 5's default; with 4.2's USE_TZ=False, settings.configure() leaves the
    TIME_ZONE="UTC",  # process in UTC while the DB session uses America/Chicago, and the cache's
    # `expires` column reads 6 h off (the key TTL itself stays the cache default, 300 s).
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    SECRET_KEY="tfv-example-not-secret",
    INSTALLED_APPS=[],
    MIDDLEWARE=["idempotency_key.middleware.IdempotencyKeyMiddleware"],
    DATABASES={
        "default": {"ENGINE": "django.db.backends.postgresql", **database_settings()}
    },
    CACHES={
        "default": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "idempotency_key_cache",
        }
    },
    IDEMPOTENCY_KEY={
        "STORAGE": {"CLASS": "idempotency_key.storage.CacheKeyStorage", "CACHE_NAME": "default"},
        "LOCK": {
            "CLASS": "idempotency_key.locks.redis.MultiProcessRedisLock",
            "LOCATION": os.environ.get("TFV_REDIS_URL", "redis://127.0.0.1:6379/11"),
            "NAME": os.environ.get("TFV_LOCK_NAME", "MyLock"),
        },
    },
)
django.setup()

from django.db import connection  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.http import require_POST  # noqa: E402


@require_POST
def create_order(request):
    try:
        data = json.loads(request.body or b"null")
    except ValueError:
        return JsonResponse({"error": "body is not JSON"}, status=400)
    item = data.get("item") if isinstance(data, dict) else None
    qty = data.get("qty") if isinstance(data, dict) else None
    if not isinstance(item, str) or not item or not isinstance(qty, int) or isinstance(qty, bool) or qty < 1:
        return JsonResponse({"error": "item must be a non-empty string and qty a positive integer"}, status=422)
    auth = request.headers.get("Authorization", "")
    owner = auth[7:] if auth.startswith("Bearer ") else None
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO orders (item, qty, owner, idempotency_key) VALUES (%s, %s, %s, %s)"
            " RETURNING id, created_at",
            [item, qty, owner, request.headers.get("Idempotency-Key")],
        )
        order_id, created_at = cur.fetchone()
    body = {"id": order_id, "item": item, "qty": qty, "owner": owner, "created_at": created_at.isoformat()}
    response = JsonResponse(body, status=201)
    response["Location"] = f"/orders/{order_id}"
    return response


def healthz(request):
    return JsonResponse({"ok": True})


urlpatterns = [path("orders", create_order), path("healthz", healthz)]

from django.core.wsgi import get_wsgi_application  # noqa: E402

application = get_wsgi_application()

if __name__ == "__main__":
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
