// A Java producer: business rows and their Courier events in one transaction (JDBC, PostgreSQL's
// driver). tests/sql_producers.rs runs it (`java -cp postgresql.jar Writer.java`, connection
// from the PG* environment variables, the topic in COURIER_TOPIC, key prefix in
// COURIER_KEY_PREFIX) and docs/sql-producers.md quotes it whole.

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.List;
import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

public class Writer {
    static final String SCHEMA = System.getenv().getOrDefault("COURIER_SCHEMA", "courier");
    static final String APPEND = "SELECT \"" + SCHEMA.replace("\"", "\"\"") + "\".append_event("
        + "topic => ?, aggregate_type => 'order', aggregate_id => ?, event_type => ?,"
        + " version => ?, payload => ?, attributes => ?::jsonb)::text";

    /** Appends one event in the transaction open on `conn`; returns its id. */
    static String appendEvent(Connection conn, String topic, String orderId, String eventType,
            long version, byte[] payload, String attributesJson) throws SQLException {
        try (PreparedStatement append = conn.prepareStatement(APPEND)) {
            append.setString(1, topic);
            append.setString(2, orderId);
            append.setString(3, eventType);
            append.setLong(4, version);
            append.setBytes(5, payload);
            append.setString(6, attributesJson);
            try (ResultSet row = append.executeQuery()) {
                row.next();
                return row.getString(1);
            }
        }
    }

    /** The order's row and its event commit together, or neither does. */
    static String placeOrder(Connection conn, String topic, String orderId, long version,
            long totalCents) throws SQLException {
        try (PreparedStatement order = conn.prepareStatement(
                "INSERT INTO orders (id, version, total_cents) VALUES (?, ?, ?)"
                    + " ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version,"
                    + " total_cents = EXCLUDED.total_cents")) {
            order.setString(1, orderId);
            order.setLong(2, version);
            order.setLong(3, totalCents);
            order.executeUpdate();
            byte[] payload = ("{\"order_id\": " + json(orderId) + ", \"total_cents\": " + totalCents + "}")
                .getBytes(StandardCharsets.UTF_8);
            String attributes = "{\"correlation_id\": " + json("checkout-" + orderId)
                + ", \"source_service\": \"orders-java\", \"user_id\": \"user-7\"}";
            String eventId = appendEvent(conn, topic, orderId, "order.placed", version, payload, attributes);
            conn.commit();
            return eventId;
        } catch (SQLException e) {
            conn.rollback();
            throw e;
        }
    }

    public static void main(String[] args) throws SQLException {
        String topic = System.getenv("COURIER_TOPIC");
        String prefix = System.getenv("COURIER_KEY_PREFIX");
        List<String> orders = List.of(prefix + "-0", prefix + "-1", prefix + "-2");
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT")
            + "/" + System.getenv("PGDATABASE") + "?user=" + System.getenv("PGUSER");
        try (Connection conn = DriverManager.getConnection(url)) {
            conn.setAutoCommit(false);
            for (long version = 1; version <= 3; version++) {
                for (String orderId : orders) {
                    String eventId = placeOrder(conn, topic, orderId, version, 100 * version);
                    System.out.println("{\"committed\": {\"key\": " + json(orderId) + ", \"version\": "
                        + version + ", \"event_id\": " + json(eventId) + "}}");
                }
            }
            // A transaction that fails after its append: the event is rolled back with the order.
            String eventId = appendEvent(conn, topic, orders.get(0), "order.placed", 4, new byte[] {'{', '}'}, "{}");
            System.out.println("{\"rolled_back\": " + json(eventId) + "}");
            conn.rollback(); // payment declined
            // Events the outbox refuses: SQLSTATE 22023, the field in the error's column name.
            String[][] cases = {
                {"event_type", "OrderPlaced", "1", prefix + "-bad"},
                {"version", "order.placed", "0", prefix + "-bad"},
                {"aggregate_id", "order.placed", "1", ""},
            };
            for (String[] c : cases) {
                try (PreparedStatement order = conn.prepareStatement(
                        "INSERT INTO orders (id, version, total_cents) VALUES (?, 1, 0)")) {
                    order.setString(1, prefix + "-bad-" + c[0]);
                    order.executeUpdate();
                    appendEvent(conn, topic, c[3], c[1], Long.parseLong(c[2]), new byte[] {'{', '}'}, "{}");
                    conn.commit();
                } catch (PSQLException e) {
                    conn.rollback();
                    ServerErrorMessage server = e.getServerErrorMessage();
                    if (!"22023".equals(e.getSQLState()) || server == null) {
                        throw e;
                    }
                    System.out.println("{\"refused\": {\"case\": " + json(c[0]) + ", \"sqlstate\": "
                        + json(e.getSQLState()) + ", \"column\": " + json(server.getColumn())
                        + ", \"message\": " + json(server.getMessage()) + "}}");
                }
            }
        }
    }

    /** A JSON string (or null). */
    static String json(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            switch (ch) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                default -> {
                    if (ch < 0x20) {
                        out.append(String.format("\\u%04x", (int) ch));
                    } else {
                        out.append(ch);
                    }
                }
            }
        }
        return out.append('"').toString();
    }
}
