package relay

import (
	"errors"
	"fmt"
)

// PartialError is the error of a Publish call of several messages that
// the broker stored only some of: Stored[i] tells whether it acknowledged
// the call's i-th message. A streaming relay (package walrelay) publishes
// the events of several keys in one call. Given this error it settles the
// stored events and publishes only the others again, instead of all of
// them: a broker that does not drop repeats (Kafka, Redis, RabbitMQ)
// would store the stored ones twice. The polling relay publishes one
// message per call, so it never sees one.
//
// Stored[i] must be true only for a message the broker acknowledged. A
// message whose fate is unknown (the call gave up before its
// acknowledgement, the connection broke) counts as not stored: it is sent
// again, at worst a duplicate, which consumers drop by event id. A Stored
// of another length than the call's messages tells the relay nothing, and
// it publishes them all again.
//
// The adapters of package brokers (Kafka, NATS JetStream, and Redis and
// RabbitMQ of brokerurl) return it; a publisher of one's own can too,
// with Partial. Find it with errors.As: wrapping keeps it.
type PartialError struct {
	// Stored has one element per message of the call, in its order.
	Stored []bool
	// Err is the failure of the first message, in the call's order, that
	// was not stored.
	Err error
}

// Partial returns err as a *PartialError that says which of a call's
// messages were stored (see PartialError), or err itself when stored
// holds no true (nothing stored: a plain failure), and nil when err is
// nil.
func Partial(err error, stored []bool) error {
	if err == nil {
		return nil
	}
	for _, s := range stored {
		if s {
			return &PartialError{Stored: stored, Err: err}
		}
	}
	return err
}

// Error says how many of the call's messages were stored, then Err.
func (e *PartialError) Error() string {
	n := 0
	for _, s := range e.Stored {
		if s {
			n++
		}
	}
	return fmt.Sprintf("%d of %d messages stored, the others not: %v", n, len(e.Stored), e.Err)
}

// Unwrap returns Err, so that errors.Is and errors.As see it (ErrPermanent
// among others).
func (e *PartialError) Unwrap() error { return e.Err }

// StoredOf returns which of a call's n messages err says the broker
// stored (a *PartialError in its chain, with n elements), or nil when it
// says nothing of them.
func StoredOf(err error, n int) []bool {
	var pe *PartialError
	if !errors.As(err, &pe) || len(pe.Stored) != n {
		return nil
	}
	return pe.Stored
}
