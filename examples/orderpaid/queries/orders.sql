-- name: CreateOrder :exec
INSERT INTO orders (id, customer_id, amount_cents, currency) VALUES (?, ?, ?, ?);

-- name: GetOrder :one
SELECT * FROM orders WHERE id = ?;

-- name: MarkOrderPaid :execrows
-- Only a new order can be paid: the WHERE clause is the state machine.
UPDATE orders SET status = 'paid', paid_at = ? WHERE id = ? AND status = 'new';

-- name: CountPendingEvents :one
-- sqlc knows the outbox table because outbox.sql is in its schema.
SELECT COUNT(*) FROM outbox_event WHERE status = 0;
