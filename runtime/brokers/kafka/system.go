package kafka

// MessagingSystem returns "kafka", the messaging.system attribute of the
// relay's send spans (OpenTelemetry messaging conventions).
func (*Publisher) MessagingSystem() string { return "kafka" }

// MessagingSystem returns "kafka", the messaging.system attribute of the
// consumers' process spans.
func (*Subscriber) MessagingSystem() string { return "kafka" }
