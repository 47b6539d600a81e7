package brokerurl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

func openStdout(u *brokerURL, opt Options) (message.Publisher, error) {
	if rest := u.base[len(u.scheme)+1:]; rest != "" && rest != "//" {
		return nil, u.errorf("stdout takes no address: write stdout:")
	}
	if err := u.noMoreParams(); err != nil {
		return nil, err
	}
	return &stdoutPublisher{w: opt.Stdout}, nil
}

// stdoutPublisher writes one JSON line per message.
type stdoutPublisher struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

// stdoutLine is the JSON object written per message.
type stdoutLine struct {
	Topic    string            `json:"topic"`
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata"`
	Payload  any               `json:"payload"`
}

// Publish writes msgs as JSON lines, in order, one Write call each.
func (p *stdoutPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("brokerurl: stdout: publisher closed")
	}
	for _, m := range msgs {
		line := stdoutLine{Topic: topic, UUID: m.UUID, Metadata: m.Metadata, Payload: string(m.Payload)}
		if line.Metadata == nil {
			line.Metadata = map[string]string{}
		}
		if json.Valid(m.Payload) {
			var b bytes.Buffer
			if err := json.Compact(&b, m.Payload); err == nil {
				line.Payload = json.RawMessage(b.Bytes())
			}
		}
		b, err := json.Marshal(line)
		if err != nil {
			return fmt.Errorf("brokerurl: stdout: message %s: %w", m.UUID, err)
		}
		if _, err := p.w.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("brokerurl: stdout: write message %s: %w", m.UUID, err)
		}
	}
	return nil
}

// Close makes later publishes fail; it does not close the writer.
func (p *stdoutPublisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	return nil
}
