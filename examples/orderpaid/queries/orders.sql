-- name: CreateCustomer :exec
INSERT INTO customers (id, phone) VALUES (sqlc.arg(id), sqlc.arg(phone));

-- name: CreateOrder :exec
INSERT INTO orders (id, customer_id, amount_cents, currency)
VALUES (sqlc.arg(id), sqlc.arg(customer_id), sqlc.arg(amount_cents), sqlc.arg(currency));

-- name: MarkOrderPaid :execrows
-- Only a new order can be paid: the WHERE clause is the state machine. On
-- PostgreSQL and MySQL the UPDATE also locks the order row until commit, so
-- the events of one order are committed in outbox id order (the relay's
-- per-key order relies on it).
UPDATE orders SET status = 'paid', paid_at = sqlc.arg(paid_at)
WHERE id = sqlc.arg(id) AND status = 'new';

-- name: MarkOrderRefunded :execrows
UPDATE orders SET status = 'refunded', refunded_at = sqlc.arg(refunded_at)
WHERE id = sqlc.arg(id) AND status = 'paid';

-- name: GetOrder :one
SELECT id, customer_id, amount_cents, currency, status FROM orders WHERE id = sqlc.arg(id);

-- name: CountOrders :one
SELECT COUNT(*) FROM orders WHERE status = sqlc.arg(status);
