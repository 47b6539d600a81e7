package bench

// BenchmarkFailing: a backlog whose publishes fail now and then, on
// PostgreSQL, MariaDB and SQLite. 20,000 rows of 2,000 keys; one event in
// ten fails to publish (picked by a hash of the event id, so the drain
// knows beforehand which rows it can send), and the
// relay's default backoff (a minute) keeps each failed row and the rows of
// its key behind it out of the drain. The drain ends with the last row
// sent before its key's first failure (the healthy rows: about 58 % of
// the backlog); to get there it passes over every row, sending, failing
// or holding it. So it reports the healthy rows' rate ("rows/s") and the
// pace over the whole backlog ("backlog/s": its rows over the same time),
// and compares that pace with the same backlog drained without failures
// in the same round ("x_clean"). On MariaDB it also reports the
// statements the server ran per claim that leased rows (its Questions:
// every session's, so the recordings' too and a few of the benchmark's
// own).
//
//	go test ./bench -run '^$' -bench BenchmarkFailing -benchtime 1x

import (
	"database/sql"
	"errors"
	"hash/fnv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxgen/outboxgen/runtime/relay"
)

const (
	failingRows  = 20_000
	failingKeys  = 2_000
	failingEvery = 10 // one event in failingEvery fails
)

// fails reports whether publishing the event with this id fails.
func fails(eventID string) bool {
	h := fnv.New32a()
	h.Write([]byte(eventID))
	return h.Sum32()%failingEvery == 0
}

// failingPublisher fails every attempt of the events fails picks
// (the drain ends long before their backoff of a minute), passing the
// others to the sink. A call with a failing event fails whole, before any
// of its messages is published.
type failingPublisher struct {
	message.Publisher
}

var errBrokerRefused = errors.New("bench: broker refused the message")

func (p failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if fails(m.UUID) {
			return errBrokerRefused
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}

// healthyRows counts the rows publishable before their key's first
// failure: each key's rows in id order up to the first that fails.
func healthyRows(b *testing.B, db *sql.DB) int {
	rows, err := db.Query("SELECT biz_id, event_id FROM outbox_event ORDER BY id")
	if err != nil {
		b.Fatal(err)
	}
	defer rows.Close()
	stopped := map[string]bool{}
	n := 0
	for rows.Next() {
		var key, id string
		if err := rows.Scan(&key, &id); err != nil {
			b.Fatal(err)
		}
		if stopped[key] {
			continue
		}
		if fails(id) {
			stopped[key] = true
			continue
		}
		n++
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return n
}

// statements returns how many statements MariaDB has run so far (its
// Questions: the client's statements, not those inside a procedure).
func statements(b *testing.B, db *sql.DB) int64 {
	var name string
	var n int64
	if err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
		b.Fatal(err)
	}
	return n
}

func BenchmarkFailing(b *testing.B) {
	srv := openServers(b)
	for _, d := range []string{"postgres", "mysql", "sqlite"} {
		var clean float64
		for _, failing := range []bool{false, true} {
			name := d + "/clean"
			if failing {
				name = d + "/failing"
			}
			b.Run(name, func(b *testing.B) {
				var res failingResult
				for b.Loop() {
					res = drainFailing(b, srv, d, failing)
				}
				b.ReportMetric(res.rate, "rows/s")
				b.ReportMetric(res.pace, "backlog/s")
				if d == "mysql" {
					b.ReportMetric(res.stmts, "stmts/claim")
				}
				if !failing {
					clean = res.pace
				} else if clean > 0 {
					b.ReportMetric(res.pace/clean, "x_clean")
				}
			})
		}
	}
}

type failingResult struct {
	rate  float64 // rows/s of the rows sent
	pace  float64 // the backlog's rows over the same time
	stmts float64 // MariaDB: statements per claim that leased rows
}

func drainFailing(b *testing.B, srv *servers, d string, failing bool) failingResult {
	db := freshOutbox(b, d)
	srv.fill(b)
	defer withKeys(failingKeys)()
	fillBacklog(b, db, d, failingRows)
	analyze(b, db, d)
	want := failingRows
	if failing {
		want = healthyRows(b, db)
	}
	s := newSink(b, want)
	var pub message.Publisher = s.pub
	if failing {
		pub = failingPublisher{Publisher: s.pub}
	}
	td := &timedDriver{Driver: benchDriver(b, db, d)}
	r, err := relay.New(td, relay.Config{Publisher: pub, Logger: discard})
	if err != nil {
		b.Fatal(err)
	}
	srv.measure(b)
	var before int64
	if d == "mysql" {
		before = statements(b, db)
	}
	start, stop := background(b, "relay", r.Run)
	s.wait(b, 10*time.Minute)
	dur := time.Since(start)
	stop()
	if s.dups > 0 {
		b.Logf("%d duplicate deliveries", s.dups)
	}
	if failing {
		// Nothing behind a failure may have been published: per-key order.
		if got := s.received(); got != want {
			b.Fatalf("sink got %d messages, want the %d healthy rows", got, want)
		}
	}
	var stmts float64
	if d == "mysql" {
		stmts = float64(statements(b, db)-before) / float64(td.n)
	}
	var times []time.Duration
	s.mu.Lock()
	for _, t := range s.recv {
		times = append(times, t.Sub(start))
	}
	s.mu.Unlock()
	sortDurations(times)
	b.Logf("%s failing=%v: claims %d, rows/claim %.1f, asked %.1f, claim mean %.2f ms max %.1f; arrivals p50 %s p90 %s p99 %s last %s",
		d, failing, td.n, float64(td.rows)/float64(td.n), float64(td.asked)/float64(td.n), float64(td.total.Microseconds())/1000/float64(td.n), float64(td.max.Microseconds())/1000,
		percentile(times, .5), percentile(times, .9), percentile(times, .99), percentile(times, 1))
	return failingResult{rate: float64(want) / dur.Seconds(), pace: failingRows / dur.Seconds(), stmts: stmts}
}
