// Smallest Express glue around express-idempotency 1.0.6 with express-idempotency-redis-adapter
// 1.0.8: POST /orders inserts one row into the `orders` table and answers 201 with the order.
// Set up as the two READMEs show: a RedisAdapter from a connection URL, connect(), then
// app.use(idempotency.idempotency({ dataAdapter })); the route returns early on isHit(req) and
// calls reportError(req) when processing fails. Every other option is the library's default.
// Environment: TFV_DATABASE_URL (required), TFV_REDIS_URL, PORT.
'use strict';
const express = require('express');
const idempotency = require('express-idempotency');
const RedisAdapter = require('express-idempotency-redis-adapter').default;
const { Pool } = require('pg');

const pool = new Pool({ connectionString: process.env.TFV_DATABASE_URL, max: 8 });
const adapter = new RedisAdapter({
  connectionConfig: { url: process.env.TFV_REDIS_URL || 'redis://127.0.0.1:6379/13' },
});
adapter.connect().catch((error) => {
  throw error;
});

const app = express();
app.use(express.json());
app.use(idempotency.idempotency({ dataAdapter: adapter }));

app.get('/healthz', (req, res) => res.json({ ok: true }));

app.post('/orders', async (req, res) => {
  const idempotencyService = idempotency.getSharedIdempotencyService();
  if (idempotencyService.isHit(req)) {
    return;
  }
  const { item, qty } = req.body || {};
  if (typeof item !== 'string' || item === '' || !Number.isInteger(qty) || qty < 1) {
    return res.status(422).json({ error: 'item must be a non-empty string and qty a positive integer' });
  }
  const auth = req.get('Authorization') || '';
  const owner = auth.startsWith('Bearer ') ? auth.slice(7) : null;
  try {
    const { rows } = await pool.query(
      'INSERT INTO orders (item, qty, owner, idempotency_key) VALUES ($1, $2, $3, $4) RETURNING id, created_at',
      [item, qty, owner, req.get('Idempotency-Key') || null],
    );
    const { id, created_at } = rows[0];
    res.status(201).location(`/orders/${id}`).json({ id: Number(id), item, qty, owner, created_at });
  } catch (err) {
    await idempotencyService.reportError(req);
    res.status(500).json({ error: 'could not create the order' });
  }
});

const port = Number(process.env.PORT || 3000);
app.listen(port, '127.0.0.1', () => console.log(`listening on 127.0.0.1:${port}`));
