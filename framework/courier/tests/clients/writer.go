// A Go producer: business rows and their Courier events in one transaction (pgx).
// tests/sql_producers.rs runs it (`go run writer.go`, connection from the PG* environment
// variables, the topic in COURIER_TOPIC, key prefix in COURIER_KEY_PREFIX) and
// docs/sql-producers.md quotes it whole. It is built against pgx v4, which Debian packages;
// with pgx v5 the import paths are github.com/jackc/pgx/v5 and github.com/jackc/pgx/v5/pgconn,
// and nothing else changes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

// The framework's schema.
func schema() string {
	if s := os.Getenv("COURIER_SCHEMA"); s != "" {
		return s
	}
	return "courier"
}

// appendEvent appends one event in the transaction `tx`; returns its id.
func appendEvent(ctx context.Context, tx pgx.Tx, topic, orderID, eventType string, version int64,
	payload []byte, attributes map[string]string) (string, error) {
	attrs, err := json.Marshal(attributes)
	if err != nil {
		return "", err
	}
	var eventID string
	err = tx.QueryRow(ctx,
		"SELECT "+pgx.Identifier{schema()}.Sanitize()+".append_event(topic => $1,"+
			" aggregate_type => 'order', aggregate_id => $2, event_type => $3, version => $4,"+
			" payload => $5, attributes => $6::text::jsonb)::text",
		topic, orderID, eventType, version, payload, string(attrs)).Scan(&eventID)
	return eventID, err
}

// placeOrder commits the order's row and its event together, or neither.
func placeOrder(ctx context.Context, conn *pgx.Conn, topic, orderID string, version, totalCents int64) (string, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx) // a no-op once committed
	if _, err := tx.Exec(ctx,
		"INSERT INTO orders (id, version, total_cents) VALUES ($1, $2, $3)"+
			" ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version,"+
			" total_cents = EXCLUDED.total_cents",
		orderID, version, totalCents); err != nil {
		return "", err
	}
	payload, err := json.Marshal(map[string]any{"order_id": orderID, "total_cents": totalCents})
	if err != nil {
		return "", err
	}
	attributes := map[string]string{
		"correlation_id": "checkout-" + orderID,
		"source_service": "orders-go",
		"user_id":        "user-7",
	}
	eventID, err := appendEvent(ctx, tx, topic, orderID, "order.placed", version, payload, attributes)
	if err != nil {
		return "", err
	}
	return eventID, tx.Commit(ctx)
}

func printLine(line map[string]any) {
	text, err := json.Marshal(line)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(text))
}

func run(ctx context.Context) error {
	topic := os.Getenv("COURIER_TOPIC")
	prefix := os.Getenv("COURIER_KEY_PREFIX")
	conn, err := pgx.Connect(ctx, "") // PGHOST, PGPORT, PGUSER, PGDATABASE
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	orders := []string{prefix + "-0", prefix + "-1", prefix + "-2"}
	for version := int64(1); version <= 3; version++ {
		for _, orderID := range orders {
			eventID, err := placeOrder(ctx, conn, topic, orderID, version, 100*version)
			if err != nil {
				return err
			}
			printLine(map[string]any{"committed": map[string]any{
				"key": orderID, "version": version, "event_id": eventID}})
		}
	}

	// A transaction that fails after its append: the event is rolled back with the order.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	eventID, err := appendEvent(ctx, tx, topic, orders[0], "order.placed", 4, []byte("{}"), map[string]string{})
	if err != nil {
		return err
	}
	printLine(map[string]any{"rolled_back": eventID})
	if err := tx.Rollback(ctx); err != nil { // payment declined
		return err
	}

	// Events the outbox refuses: SQLSTATE 22023, the field in the error's column name.
	for _, bad := range []struct {
		event, eventType string
		version          int64
		orderID          string
	}{
		{"event_type", "OrderPlaced", 1, prefix + "-bad"},
		{"version", "order.placed", 0, prefix + "-bad"},
		{"aggregate_id", "order.placed", 1, ""},
	} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, version, total_cents) VALUES ($1, 1, 0)",
			prefix+"-bad-"+bad.event); err != nil {
			return err
		}
		_, err = appendEvent(ctx, tx, topic, bad.orderID, bad.eventType, bad.version, []byte("{}"), map[string]string{})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" {
			return fmt.Errorf("%s: expected a refusal, got %v", bad.event, err)
		}
		printLine(map[string]any{"refused": map[string]any{"case": bad.event,
			"sqlstate": pgErr.Code, "column": pgErr.ColumnName, "message": pgErr.Message}})
		if err := tx.Rollback(ctx); err != nil {
			return err
		}
	}
	return nil
}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
