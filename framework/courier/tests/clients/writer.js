// A Node producer: business rows and their Courier events in one transaction (pg).
//
// tests/sql_producers.rs runs it (connection from the PG* environment variables, the topic in
// COURIER_TOPIC, key prefix in COURIER_KEY_PREFIX) and docs/sql-producers.md quotes it whole.
'use strict';
const { Client } = require('pg');

const SCHEMA = process.env.COURIER_SCHEMA || 'courier'; // the framework's schema, a plain identifier
const APPEND =
  `SELECT ${SCHEMA}.append_event(topic => $1, aggregate_type => 'order', aggregate_id => $2,` +
  ` event_type => $3, version => $4, payload => $5, attributes => $6::jsonb) AS event_id`;

// Appends one event in the transaction open on `client`; returns its id.
async function appendEvent(client, topic, orderId, eventType, version, payload, attributes) {
  const { rows } = await client.query(APPEND, [
    topic, orderId, eventType, version, payload, JSON.stringify(attributes),
  ]);
  return rows[0].event_id;
}

// Runs `work` in a transaction: COMMIT when it returns, ROLLBACK when it throws.
async function inTransaction(client, work) {
  await client.query('BEGIN');
  try {
    const result = await work();
    await client.query('COMMIT');
    return result;
  } catch (e) {
    await client.query('ROLLBACK');
    throw e;
  }
}

// The order's row and its event commit together, or neither does.
async function placeOrder(client, topic, orderId, version, totalCents) {
  return inTransaction(client, async () => {
    await client.query(
      'INSERT INTO orders (id, version, total_cents) VALUES ($1, $2, $3)' +
        ' ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version,' +
        ' total_cents = EXCLUDED.total_cents',
      [orderId, version, totalCents],
    );
    const payload = Buffer.from(JSON.stringify({ order_id: orderId, total_cents: totalCents }));
    const attributes = {
      correlation_id: `checkout-${orderId}`,
      source_service: 'orders-node',
      user_id: 'user-7',
    };
    return appendEvent(client, topic, orderId, 'order.placed', version, payload, attributes);
  });
}

async function main() {
  const topic = process.env.COURIER_TOPIC;
  const prefix = process.env.COURIER_KEY_PREFIX;
  const orders = [0, 1, 2].map((i) => `${prefix}-${i}`);
  const client = new Client(); // PGHOST, PGPORT, PGUSER, PGDATABASE
  await client.connect();
  try {
    for (const version of [1, 2, 3]) {
      for (const orderId of orders) {
        const eventId = await placeOrder(client, topic, orderId, version, 100 * version);
        console.log(JSON.stringify({ committed: { key: orderId, version, event_id: eventId } }));
      }
    }
    // A transaction that fails after its append: the event is rolled back with the order.
    try {
      await inTransaction(client, async () => {
        const eventId = await appendEvent(client, topic, orders[0], 'order.placed', 4, Buffer.from('{}'), {});
        console.log(JSON.stringify({ rolled_back: eventId }));
        throw new Error('payment declined');
      });
    } catch (e) {
      if (e.message !== 'payment declined') throw e;
    }
    // Events the outbox refuses: SQLSTATE 22023, the field in the error's column name.
    for (const [kase, eventType, version, orderId] of [
      ['event_type', 'OrderPlaced', 1, `${prefix}-bad`],
      ['version', 'order.placed', 0, `${prefix}-bad`],
      ['aggregate_id', 'order.placed', 1, ''],
    ]) {
      try {
        await inTransaction(client, async () => {
          await client.query('INSERT INTO orders (id, version, total_cents) VALUES ($1, 1, 0)', [
            `${prefix}-bad-${kase}`,
          ]);
          await appendEvent(client, topic, orderId, eventType, version, Buffer.from('{}'), {});
        });
      } catch (e) {
        if (e.code !== '22023') throw e;
        console.log(JSON.stringify({
          refused: { case: kase, sqlstate: e.code, column: e.column, message: e.message },
        }));
      }
    }
  } finally {
    await client.end();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
