-- name: AddLedgerEntry :exec
INSERT INTO points_ledger (event_id, customer_id, order_id, kind, points)
VALUES (sqlc.arg(event_id), sqlc.arg(customer_id), sqlc.arg(order_id), sqlc.arg(kind), sqlc.arg(points));

-- name: AddPoints :execrows
-- A delta, not "SET points = <new balance>": it commutes, so the result does
-- not depend on the order in which credits and debits arrive.
UPDATE customers SET points = points + sqlc.arg(delta) WHERE id = sqlc.arg(id);

-- name: GetCustomerPhone :one
SELECT phone FROM customers WHERE id = sqlc.arg(id);

-- name: RecordSMS :exec
INSERT INTO sms_messages (event_id, customer_id, phone, kind, body)
VALUES (sqlc.arg(event_id), sqlc.arg(customer_id), sqlc.arg(phone), sqlc.arg(kind), sqlc.arg(body));

-- name: CountLedger :one
SELECT COUNT(*) FROM points_ledger WHERE kind = sqlc.arg(kind);

-- name: CountSMS :one
SELECT COUNT(*) FROM sms_messages WHERE kind = sqlc.arg(kind);

-- name: CountBalanceMismatches :one
-- Customers whose balance differs from the sum of their ledger entries.
SELECT COUNT(*) FROM customers c
WHERE c.points <> (
    SELECT COALESCE(SUM(CASE WHEN l.kind = 'credit' THEN l.points ELSE -l.points END), 0)
    FROM points_ledger l WHERE l.customer_id = c.id
);

-- name: CountOutboxSent :one
-- sqlc knows outbox_event because outbox.sql is in its schema.
SELECT COUNT(*) FROM outbox_event WHERE biz_type = sqlc.arg(biz_type) AND status = 1;
