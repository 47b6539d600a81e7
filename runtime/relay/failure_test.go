package relay

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// A publish error wrapped with Permanent marks the row FAILED at once; its
// key is held back, other keys flow.
func TestPermanentFailure(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		pub := newRecPub(t)
		ins := insertEvents(t, db, d, ev{Key: "A"}, ev{Key: "B"}, ev{Key: "A"})
		bad := ins[0].ID
		pub.setFail(func(m *message.Message) error {
			if m.UUID == bad {
				return Permanent(errors.New("subject refused"))
			}
			return nil
		})
		var failed []FailedEvent
		opts := testOptions(pub, "permanent")
		opts.MaxAttempts = 5
		opts.OnFailed = func(f FailedEvent) { failed = append(failed, f) }
		r := mustRelay(t, drv, opts)
		if _, err := r.poll(ctx); err != nil {
			t.Fatal(err)
		}
		if s := state(t, db, d, bad); s.Status != 2 || s.RetryCount != 1 || s.LastError.String != "subject refused" {
			t.Fatalf("permanently failing row: %+v, want FAILED after 1 attempt", s)
		}
		if len(failed) != 1 || failed[0].EventID != bad {
			t.Fatalf("OnFailed calls: %+v", failed)
		}
		if pub.successCount()[ins[1].ID] != 1 {
			t.Fatal("key B did not flow")
		}
		if s := state(t, db, d, ins[2].ID); s.Status != 0 || s.RetryCount != 0 || pub.attemptsOf(ins[2].ID) != 0 {
			t.Fatalf("the event behind the failed head of A: %+v, want untouched", s)
		}
	})
}

// Rows the relay cannot turn into a message fail at once, without a
// publish; a base64 payload (txpublisher.Config.BinaryPayloads) is published as
// the original bytes, without its encoding header.
func TestStoredPayloadEncoding(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		pub := newRecPub(t)
		ins := insertEvents(t, db, d, ev{Key: "bin"}, ev{Key: "rot13"}, ev{Key: "junk"})
		raw := []byte{0, 1, 0xfe, 0xff, '{'}
		set := func(id, payload, headers string) {
			t.Helper()
			q := fmt.Sprintf("UPDATE %s SET payload = %s, headers = %s WHERE event_id = %s", table, d.Placeholder(1), d.Placeholder(2), d.Placeholder(3))
			if _, err := db.Exec(q, payload, headers, id); err != nil {
				t.Fatal(err)
			}
		}
		set(ins[0].ID, `"`+base64.StdEncoding.EncodeToString(raw)+`"`, `{"outbox_payload_encoding":"base64","trace":"t1"}`)
		set(ins[1].ID, `{"a":1}`, `{"outbox_payload_encoding":"rot13"}`)
		set(ins[2].ID, `{"a":1}`, `["not","an","object"]`)

		opts := testOptions(pub, "encoding")
		r := mustRelay(t, drv, opts)
		if _, err := r.poll(ctx); err != nil {
			t.Fatal(err)
		}
		oks := pub.successes()
		if len(oks) != 1 || oks[0].Msg.UUID != ins[0].ID {
			t.Fatalf("published %d messages, want only the base64 one", len(oks))
		}
		m := oks[0].Msg
		if string(m.Payload) != string(raw) || m.Metadata.Get("trace") != "t1" {
			t.Fatalf("payload %v, trace %q: want the decoded bytes and the header", m.Payload, m.Metadata.Get("trace"))
		}
		if _, ok := m.Metadata[outbox.HeaderPayloadEncoding]; ok {
			t.Fatal("the encoding header was passed on")
		}
		for _, id := range []string{ins[1].ID, ins[2].ID} {
			if s := state(t, db, d, id); s.Status != 2 || s.RetryCount != 1 || pub.attemptsOf(id) != 0 {
				t.Fatalf("row %s: %+v, %d publish attempts; want FAILED at once, never published", id, s, pub.attemptsOf(id))
			}
		}
	})
}

// slowPub takes delay per message and ignores the message context, like
// most broker clients.
type slowPub struct {
	*recPub
	delay time.Duration
}

func (p slowPub) Publish(topic string, msgs ...*message.Message) error {
	time.Sleep(p.delay)
	return p.recPub.Publish(topic, msgs...)
}

// A slow batch keeps its lease alive: the heartbeat extends it while the
// batch publishes, so a batch longer than the lease is published whole in
// one poll and no other instance can claim its rows meanwhile.
func TestLeaseHeartbeat(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		rec := newRecPub(t)
		evs := make([]ev, 12)
		for i := range evs {
			evs[i] = ev{Key: "hot"}
		}
		ins := insertEvents(t, db, d, evs...)
		var foreign []int
		rec.setFail(func(m *message.Message) error {
			// Past the original lease, another instance tries to claim.
			if m.UUID == ins[10].ID {
				rows, err := drv.Claim(ctx, driver.ClaimParams{Owner: "other", Lease: time.Hour, Limit: 100})
				if err != nil {
					return Permanent(err)
				}
				foreign = append(foreign, len(rows))
			}
			return nil
		})
		opts := testOptions(slowPub{recPub: rec, delay: 150 * time.Millisecond}, "heartbeat")
		opts.LeaseDuration = time.Second // 12 × 150ms outlast it
		opts.ShutdownTimeout = 500 * time.Millisecond
		failOnPollErrors(t, &opts)
		r := mustRelay(t, drv, opts)
		if n, err := r.poll(ctx); err != nil || n != len(ins) {
			t.Fatalf("poll claimed %d (%v), want all %d", n, err, len(ins))
		}
		if sent := count(t, db, "status = 1"); sent != len(ins) {
			t.Fatalf("%d of %d sent in one poll: the batch stopped although its lease could be extended", sent, len(ins))
		}
		if len(foreign) != 1 || foreign[0] != 0 {
			t.Fatalf("a foreign claim during the batch took %v rows, want 0", foreign)
		}
		checkKeyOrder(t, rec, ins)
	})
}

// extendFails is a driver whose ExtendLease fails while down is set, like
// a database that cannot be reached.
type extendFails struct {
	driver.Driver
	down atomic.Bool
}

func (x *extendFails) ExtendLease(ctx context.Context, owner string, ids []int64, lease time.Duration) (int64, error) {
	if x.down.Load() {
		return 0, errors.New("database unreachable (injected)")
	}
	return x.Driver.ExtendLease(ctx, owner, ids, lease)
}

// When the lease cannot be extended, a batch stops publishing before the
// lease it holds lapses and gives the rest of the key back untouched, so
// no other instance publishes the key at the same time; the next polls
// carry on in order.
func TestBatchStopsBeforeLeaseLapses(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		rec := newRecPub(t)
		evs := make([]ev, 12)
		for i := range evs {
			evs[i] = ev{Key: "hot"}
		}
		ins := insertEvents(t, db, d, evs...)
		xd := &extendFails{Driver: drv}
		xd.down.Store(true)
		opts := testOptions(slowPub{recPub: rec, delay: 150 * time.Millisecond}, "lease")
		opts.LeaseDuration = time.Second // 12 × 150ms cannot fit
		opts.ShutdownTimeout = 500 * time.Millisecond
		r := mustRelay(t, xd, opts)
		if n, err := r.poll(ctx); err != nil || n != len(ins) {
			t.Fatalf("first poll claimed %d (%v), want all %d", n, err, len(ins))
		}
		sent := count(t, db, "status = 1")
		released := count(t, db, "status = 0 AND retry_count = 0 AND lease_owner IS NULL")
		if sent == 0 || sent == len(ins) || sent+released != len(ins) {
			t.Fatalf("after one poll: %d sent, %d released untouched, of %d; want a part sent and the rest released", sent, released, len(ins))
		}
		for count(t, db, "status = 1") < len(ins) {
			if _, err := r.poll(ctx); err != nil {
				t.Fatal(err)
			}
		}
		checkKeyOrder(t, rec, ins)
		if n := len(rec.successes()); n != len(ins) {
			t.Fatalf("%d publishes for %d events: a released row was published twice", n, len(ins))
		}
	})
}

// PublishTimeout bounds a batch: past it the batch starts no new publish
// and releases the rest uncharged, although its lease still holds.
func TestPublishTimeout(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		rec := newRecPub(t)
		evs := make([]ev, 12)
		for i := range evs {
			evs[i] = ev{Key: "hot"}
		}
		ins := insertEvents(t, db, d, evs...)
		opts := testOptions(slowPub{recPub: rec, delay: 100 * time.Millisecond}, "timeout")
		opts.PublishTimeout = 350 * time.Millisecond // 12 × 100ms cannot fit
		r := mustRelay(t, drv, opts)
		if n, err := r.poll(ctx); err != nil || n != len(ins) {
			t.Fatalf("first poll claimed %d (%v), want all %d", n, err, len(ins))
		}
		sent := count(t, db, "status = 1")
		released := count(t, db, "status = 0 AND retry_count = 0 AND lease_owner IS NULL")
		if sent == 0 || sent == len(ins) || sent+released != len(ins) {
			t.Fatalf("after one poll: %d sent, %d released untouched, of %d; want a part sent and the rest released", sent, released, len(ins))
		}
		for count(t, db, "status = 1") < len(ins) {
			if _, err := r.poll(ctx); err != nil {
				t.Fatal(err)
			}
		}
		checkKeyOrder(t, rec, ins)
	})
}

// A publisher error quoting a broker URL with a password and echoing a
// large payload reaches last_error, OnFailed and the log with the password
// masked and cut to dialect.ErrorTextLimit.
func TestPublishErrorRedactedAndCapped(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		ctx := context.Background()
		pub := newRecPub(t)
		ins := insertEvents(t, db, d, ev{Key: "A"})
		echo := strings.Repeat("payload ", 1000)
		pub.setFail(func(m *message.Message) error {
			return Permanent(fmt.Errorf("nats: dial nats://relay:S3cretPw@broker:4222: refused; message was %s", echo))
		})
		var failed []FailedEvent
		opts := testOptions(pub, "redact")
		opts.MaxAttempts = 1
		opts.OnFailed = func(f FailedEvent) { failed = append(failed, f) }
		h := &errLog{}
		opts.Logger = slog.New(h)
		r := mustRelay(t, drv, opts)
		if _, err := r.poll(ctx); err != nil {
			t.Fatal(err)
		}
		s := state(t, db, d, ins[0].ID)
		if s.Status != 2 || !strings.Contains(s.LastError.String, "nats://relay:xxxxx@broker:4222") {
			t.Fatalf("row after a permanent failure: status %d, last_error %.120q", s.Status, s.LastError.String)
		}
		if len(s.LastError.String) > dialect.ErrorTextLimit {
			t.Errorf("last_error holds %d bytes, want at most %d", len(s.LastError.String), dialect.ErrorTextLimit)
		}
		if len(failed) != 1 || failed[0].LastError != s.LastError.String {
			t.Errorf("OnFailed: %+v", failed)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.msgs) == 0 {
			t.Fatal("nothing logged")
		}
		for _, m := range h.msgs {
			if strings.Contains(m, "S3cretPw") {
				t.Errorf("log line holds the password: %.200s", m)
			}
			if len(m) > 2*dialect.ErrorTextLimit {
				t.Errorf("log line of %d bytes: the broker's text is not capped", len(m))
			}
		}
	})
}

// runPastBadError runs a relay with opts, whose publisher fails every
// publish of row ins[0] with the error text, until that row is FAILED,
// ins[1] (published beside it) is marked sent and 20 rows inserted once
// the relay runs are published: a recording the database refuses stalls
// the relay, and this times out.
func runPastBadError(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver, pub *recPub, opts Config, ins []inserted, text string) {
	t.Helper()
	bad := ins[0].ID
	pub.setFail(func(m *message.Message) error {
		if m.UUID == bad {
			return errors.New(text)
		}
		return nil
	})
	stop := runRelay(t, mustRelay(t, drv, opts))
	defer stop()
	var evs []ev
	for range 20 {
		evs = append(evs, ev{Key: "C"})
	}
	more := insertEvents(t, db, d, evs...)
	waitFor(t, "the row with the bad error text FAILED, and every other row sent", func() bool {
		sc := pub.successCount()
		for _, m := range append(more, ins[1]) {
			if sc[m.ID] == 0 {
				return false
			}
		}
		return state(t, db, d, bad).Status == 2 && state(t, db, d, ins[1].ID).Status == 1
	})
}

// narrowLastError gives the outbox a last_error column the database
// refuses the tests' error texts in (latin1 on MySQL, 60 characters on
// PostgreSQL); SQLite stores any text, so the test is skipped there.
func narrowLastError(t *testing.T, db *sql.DB, d dialect.Dialect) {
	t.Helper()
	alter := map[dialect.Dialect]string{
		dialect.MySQL:    "ALTER TABLE " + table + " MODIFY last_error TEXT CHARACTER SET latin1 NULL",
		dialect.Postgres: "ALTER TABLE " + table + " ALTER COLUMN last_error TYPE varchar(60)",
	}[d]
	if alter == "" {
		t.Skip("SQLite stores any text")
	}
	if _, err := db.Exec(alter); err != nil {
		t.Fatal(err)
	}
}

// A publish error that is not valid text (a broker or client quoting bytes
// it was given) is recorded cleaned. PostgreSQL refuses a NUL byte in
// last_error (and bytes that are not UTF-8, which ErrorText dropped), and
// the refusal failed every claim carrying the recording: the relay
// stalled, published nothing more (none of 20 later rows in 3 s), and the
// failing row never reached FAILED.
func TestPublishErrorNotText(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		pub := newRecPub(t)
		ins := insertEvents(t, db, d, ev{Key: "A"}, ev{Key: "B"})
		var failed []FailedEvent
		var mu sync.Mutex
		opts := testOptions(pub, "nottext")
		opts.MaxAttempts = 2
		opts.OnFailed = func(f FailedEvent) { mu.Lock(); failed = append(failed, f); mu.Unlock() }
		runPastBadError(t, db, d, drv, pub, opts, ins, "broker refused key \xff\xfe\x00: bad")
		if s := state(t, db, d, ins[0].ID); s.LastError.String != "broker refused key \uFFFD: bad" || s.RetryCount != 2 {
			t.Fatalf("row whose error is not text: %+v, want its error cleaned", s)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(failed) != 1 || failed[0].LastError != "broker refused key \uFFFD: bad" {
			t.Fatalf("OnFailed calls: %+v", failed)
		}
	})
}

// A recording the database refuses for a failure's error text (here a
// last_error column narrower than the DDL's) is sent again with
// RefusedErrorText in place of the texts. Before, every later claim
// carried the refused recording and failed: the relay stalled, as with a
// NUL byte (TestPublishErrorNotText).
func TestRecordingRefusedForErrorText(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		narrowLastError(t, db, d)
		pub := newRecPub(t)
		ins := insertEvents(t, db, d, ev{Key: "A"}, ev{Key: "B"})
		h := &errLog{}
		opts := testOptions(pub, "refused")
		opts.MaxAttempts = 2
		opts.Logger = slog.New(h)
		runPastBadError(t, db, d, drv, pub, opts, ins, "broker refused 💥 "+strings.Repeat("x", 100))
		if s := state(t, db, d, ins[0].ID); s.LastError.String != RefusedErrorText || s.RetryCount != 2 {
			t.Fatalf("row whose error text was refused: %+v, want retry_count 2 and last_error %q", s, RefusedErrorText)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, m := range h.msgs {
			if strings.Contains(m, "error texts of its failures are replaced") {
				return
			}
		}
		t.Fatalf("no warning that the texts were replaced; logged: %q", h.msgs)
	})
}

// The same at the end of a run (RunOnce, shutdown): the last recording is
// sent again with RefusedErrorText once, instead of failing.
func TestLastRecordingRefusedForErrorText(t *testing.T) {
	forEachDialect(t, func(t *testing.T, db *sql.DB, d dialect.Dialect, drv driver.Driver) {
		narrowLastError(t, db, d)
		pub := newRecPub(t)
		ins := insertEvents(t, db, d, ev{Key: "A"}, ev{Key: "B"})
		pub.setFail(func(m *message.Message) error {
			if m.UUID == ins[0].ID {
				return Permanent(errors.New("broker refused 💥 " + strings.Repeat("x", 100)))
			}
			return nil
		})
		r := mustRelay(t, drv, testOptions(pub, "refused-last"))
		if _, err := r.poll(context.Background()); err != nil {
			t.Fatalf("poll: %v", err)
		}
		if s := state(t, db, d, ins[0].ID); s.Status != 2 || s.LastError.String != RefusedErrorText {
			t.Fatalf("row whose error text was refused: %+v, want FAILED with last_error %q", s, RefusedErrorText)
		}
		if s := state(t, db, d, ins[1].ID); s.Status != 1 {
			t.Fatalf("row sent beside it: %+v, want marked sent", s)
		}
	})
}
