package brokerurl

// MessagingSystem names the broker as the OpenTelemetry messaging
// conventions do (attribute messaging.system): the relay's send spans and
// the consumers' process spans carry it.

// MessagingSystem returns "nats".
func (*natsPublisher) MessagingSystem() string { return "nats" }

// MessagingSystem returns "nats".
func (*natsSubscriber) MessagingSystem() string { return "nats" }

// MessagingSystem returns "rabbitmq".
func (*amqpPublisher) MessagingSystem() string { return "rabbitmq" }

// MessagingSystem returns "rabbitmq".
func (*amqpSubscriber) MessagingSystem() string { return "rabbitmq" }

// MessagingSystem returns "redis".
func (*redisPublisher) MessagingSystem() string { return "redis" }

// MessagingSystem returns "redis".
func (*redisSubscriber) MessagingSystem() string { return "redis" }

// MessagingSystem returns "stdout".
func (*stdoutPublisher) MessagingSystem() string { return "stdout" }
