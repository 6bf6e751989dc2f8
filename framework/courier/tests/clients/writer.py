"""A Python producer: business rows and their Courier events in one transaction (psycopg 3).

tests/sql_producers.rs runs it (connection from the PG* environment variables, the topic in
COURIER_TOPIC, key prefix in COURIER_KEY_PREFIX) and docs/sql-producers.md quotes it whole.
"""

import json
import os

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

SCHEMA = os.environ.get("COURIER_SCHEMA", "courier")  # the framework's schema
APPEND = sql.SQL(
    "SELECT {}.append_event(topic => %s, aggregate_type => 'order', aggregate_id => %s,"
    " event_type => %s, version => %s, payload => %s, attributes => %s)"
).format(sql.Identifier(SCHEMA))


def append_event(conn, topic, order_id, event_type, version, payload, attributes):
    """Appends one event in the transaction open on `conn`; returns its id."""
    row = conn.execute(
        APPEND, (topic, order_id, event_type, version, payload, Jsonb(attributes))
    ).fetchone()
    return str(row[0])


def place_order(conn, topic, order_id, version, total_cents):
    """The order's row and its event commit together, or neither does."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO orders (id, version, total_cents) VALUES (%s, %s, %s)"
            " ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version,"
            " total_cents = EXCLUDED.total_cents",
            (order_id, version, total_cents),
        )
        payload = json.dumps({"order_id": order_id, "total_cents": total_cents}).encode()
        attributes = {
            "correlation_id": f"checkout-{order_id}",
            "source_service": "orders-python",
            "user_id": "user-7",
        }
        return append_event(conn, topic, order_id, "order.placed", version, payload, attributes)


def main():
    topic = os.environ["COURIER_TOPIC"]
    prefix = os.environ["COURIER_KEY_PREFIX"]
    orders = [f"{prefix}-{i}" for i in range(3)]
    with psycopg.connect("") as conn:  # PGHOST, PGPORT, PGUSER, PGDATABASE
        for version in (1, 2, 3):
            for order_id in orders:
                event_id = place_order(conn, topic, order_id, version, 100 * version)
                print(json.dumps({"committed": {"key": order_id, "version": version,
                                                "event_id": event_id}}))
        # A transaction that fails after its append: the event is rolled back with the order.
        try:
            with conn.transaction():
                event_id = append_event(conn, topic, orders[0], "order.placed", 4, b"{}", {})
                print(json.dumps({"rolled_back": event_id}))
                raise RuntimeError("payment declined")
        except RuntimeError:
            pass
        # Events the outbox refuses: SQLSTATE 22023, the field in the error's column name.
        for case, event_type, version, order_id in [
            ("event_type", "OrderPlaced", 1, f"{prefix}-bad"),
            ("version", "order.placed", 0, f"{prefix}-bad"),
            ("aggregate_id", "order.placed", 1, ""),
        ]:
            try:
                with conn.transaction():
                    conn.execute("INSERT INTO orders (id, version, total_cents) VALUES (%s, 1, 0)",
                                 (f"{prefix}-bad-{case}",))
                    append_event(conn, topic, order_id, event_type, version, b"{}", {})
            except psycopg.errors.InvalidParameterValue as e:
                print(json.dumps({"refused": {"case": case, "sqlstate": e.sqlstate,
                                              "column": e.diag.column_name,
                                              "message": e.diag.message_primary}}))


if __name__ == "__main__":
    main()
