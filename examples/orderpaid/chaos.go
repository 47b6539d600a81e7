package main

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// countingPublisher sits between the relay and the broker. It counts the
// messages the broker accepted and, in -chaos mode, injects faults:
//
//   - failures: a fraction of Publish calls fail before reaching the
//     broker ("broker unreachable"); the relay records the failure and
//     retries after its backoff;
//   - lost acks: a fraction of Publish calls reach the broker and then
//     report an error anyway ("timeout, but it was sent"); the relay
//     retries, so the event is published twice;
//   - duplicates: a fraction of published messages is published a second
//     time with a fresh message UUID (and the same outbox_event_id), a
//     copy no broker can de-duplicate, like a re-send after JetStream's
//     duplicate window.
//
// Every injected fault must be absorbed by the relay (retries) and the
// consumers' inbox (duplicates skipped); the reconciliation proves it.
type countingPublisher struct {
	message.Publisher
	failRate, lostAckRate, dupRate float64

	mu  sync.Mutex
	rng *rand.Rand

	accepted, failures, lostAcks, dups atomic.Int64
}

var (
	errInjectedFailure = errors.New("chaos: injected publish failure (nothing was sent)")
	errInjectedLostAck = errors.New("chaos: injected lost acknowledgement (the message was sent)")
)

func newCountingPublisher(pub message.Publisher, seed uint64, failRate, lostAckRate, dupRate float64) *countingPublisher {
	return &countingPublisher{
		Publisher: pub, failRate: failRate, lostAckRate: lostAckRate, dupRate: dupRate,
		rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

func (p *countingPublisher) roll(rate float64) bool {
	if rate <= 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64() < rate
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		if p.roll(p.failRate) {
			p.failures.Add(1)
			return errInjectedFailure
		}
		var dup *message.Message
		if p.roll(p.dupRate) {
			dup = msg.Copy()
			dup.UUID = watermill.NewUUID()
		}
		lostAck := p.roll(p.lostAckRate)
		if err := p.Publisher.Publish(topic, msg); err != nil {
			return err
		}
		p.accepted.Add(1)
		if dup != nil {
			if err := p.Publisher.Publish(topic, dup); err == nil {
				p.dups.Add(1)
				p.accepted.Add(1)
			}
		}
		if lostAck {
			p.lostAcks.Add(1)
			return errInjectedLostAck
		}
	}
	return nil
}
