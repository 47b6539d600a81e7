package natsjs

// MessagingSystem returns "nats", the messaging.system attribute of the
// relay's send spans (OpenTelemetry messaging conventions).
func (*Publisher) MessagingSystem() string { return "nats" }

// MessagingSystem returns "nats", the messaging.system attribute of the
// consumers' process spans.
func (*Subscriber) MessagingSystem() string { return "nats" }
