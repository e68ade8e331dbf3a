#!/usr/bin/env bash
# Force the core race by hand against two running instances (see run.sh --serve-only):
# hold LOCK TABLE idempotency_receipts IN EXCLUSIVE MODE in a psql session, send N concurrent
# POSTs with one tenant, key and body alternately to URL_A and URL_B, wait until all N wait on
# the lock (pg_locks), COMMIT, and print each client's answer and the row counts.
#
#   race.sh URL_A URL_B DATABASE_URL [N=4] [same|other-body|other-tenant]
#
# other-body: the even-numbered clients send another body (two intents, one key);
# other-tenant: they send the same body and key under another tenant (two scopes, one key).
# Every wait is bounded (10 s for the lock waiters, 30 s per request).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,10p' "$0"; exit 2; }
A=$1 B=$2 DB=$3 N=${4:-4}
BODY1='{"actor_id":"u1","title":"Printer jammed","body":"Floor 3 printer shows E-42","priority":"high"}'
BODY2=$BODY1
TENANT="hand-$(date +%s)-$$" KEY="key-1"
TENANT2=$TENANT
case ${5:-same} in
    same) ;;
    other-body) BODY2='{"actor_id":"u1","title":"Printer jammed","body":"Floor 4 this time","priority":"high"}' ;;
    other-tenant) TENANT2="$TENANT-b" ;;
    *) echo "race.sh: unknown mode $5" >&2; exit 2 ;;
esac
OUT=$(mktemp -d "${TMPDIR:-/tmp}/tfv-race.XXXXXX")
LOCKER=""
cleanup() {
    [ -n "$LOCKER" ] && { exec 3>&- 2>/dev/null || true; kill "$LOCKER" 2>/dev/null || true; }
    rm -rf "$OUT"
}
trap cleanup EXIT

waiting() {
    psql -XAt "$DB" -c "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
        WHERE c.relname = 'idempotency_receipts' AND NOT l.granted"
}

# 1. The barrier: a session holding EXCLUSIVE (reads pass, the receipt INSERT waits).
mkfifo "$OUT/lock.fifo"
psql -X -q "$DB" <"$OUT/lock.fifo" >"$OUT/lock.out" 2>&1 &
LOCKER=$!
exec 3>"$OUT/lock.fifo"
echo "BEGIN; LOCK TABLE idempotency_receipts IN EXCLUSIVE MODE;" >&3
held() {
    psql -XAt "$DB" -c "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
        WHERE c.relname = 'idempotency_receipts' AND l.mode = 'ExclusiveLock' AND l.granted"
}
deadline=$((SECONDS + 10))
until [ "$(held)" = 1 ]; do
    [ $SECONDS -lt $deadline ] || { echo "the barrier lock was not taken within 10 s" >&2; exit 1; }
    sleep 0.05
done

# 2. N clients, alternating instances.
for i in $(seq "$N"); do
    if [ $((i % 2)) = 1 ]; then url=$A body=$BODY1 t=$TENANT; else url=$B body=$BODY2 t=$TENANT2; fi
    curl -s --max-time 30 -i -X POST "$url/v1/tickets" -H 'Content-Type: application/json' \
        -H "X-Tenant-Id: $t" -H "Idempotency-Key: $KEY" -d "$body" >"$OUT/client-$i" &
done

# 3. Proof that every client waits on the lock, then release.
deadline=$((SECONDS + 10))
until [ "$(waiting)" = "$N" ]; do
    [ $SECONDS -lt $deadline ] || { echo "only $(waiting) of $N requests wait on the lock after 10 s" >&2; break; }
    sleep 0.05
done
echo "waiting on idempotency_receipts before COMMIT: $(waiting)"
echo "COMMIT;" >&3
exec 3>&-
wait

# 4. What each client got, and what the database holds.
for i in $(seq "$N"); do
    f="$OUT/client-$i"
    status=$(head -n1 "$f" | tr -d '\r')
    by=$(grep -i '^X-Served-By:' "$f" | tr -d '\r' | cut -d' ' -f2 || true)
    replay=$(grep -qi '^Idempotent-Replayed: true' "$f" && echo " (replayed)" || true)
    path=$(grep -i '^X-Decision-Path:' "$f" | tr -d '\r' | cut -d' ' -f2 || true)
    body=$(tail -n1 "$f")
    case $body in '{"id":'*) body=${body:0:46} ;; esac   # the id is enough for a ticket
    echo "client-$i via $by: $status$replay ${path:+[$path] }$body"
done
for t in $(printf '%s\n' "$TENANT" "$TENANT2" | sort -u); do
psql -XAt "$DB" -v t="$t" <<'SQL'
SELECT :'t' || ': tickets=' || (SELECT count(*) FROM tickets WHERE tenant_id = :'t')
    || ' receipts=' || (SELECT count(*) FROM idempotency_receipts WHERE tenant_id = :'t')
    || ' created_events=' || (SELECT count(*) FROM outbox_events
                              WHERE tenant_id = :'t' AND event_type = 'ticket.created');
SQL
done
