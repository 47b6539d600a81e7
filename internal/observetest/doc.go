// Package observetest checks outboxgen's tracing and metrics end to end, on
// a real database and real brokers (an embedded NATS JetStream server and
// an in-process Kafka, kfake): one trace from the request that writes an
// event, through the relay and the broker, to the generated consumer's
// handler; and the metrics that the Grafana dashboard and the Prometheus
// alert rules under deploy/ query, in a real Prometheus exposition.
package observetest
