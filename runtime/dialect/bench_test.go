package dialect

import (
	"testing"
	"time"
)

// The per-call cost of the statements on the hot paths: the relay's claim
// and its id-list updates, a writer's insert, a consumer's record. Table
// names are rendered once per configuration; these measure what is left.

var benchIDs = func() []int64 {
	ids := make([]int64, 100)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	return ids
}()

// Variables, not constants: a constant argument would be boxed for free
// once the call is inlined, which real callers never see.
var benchConsumer, benchEventID, benchType, benchKey = "billing", "0190c7a4-0000-7000-8000-000000000001", "ORDER_PAID", "order-1"

var sinkSQL string
var sinkArgs []any

func BenchmarkClaim(b *testing.B) {
	for _, d := range All {
		q, err := NewRelayQueries(d, "outbox_event", []string{"AUDIT_LOGGED"})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(string(d), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkSQL, sinkArgs = q.Claim("relay-1", 30*time.Second, 100, 5*time.Minute, 500*time.Millisecond)
			}
		})
	}
}

func BenchmarkMarkSent100(b *testing.B) {
	for _, d := range All {
		q, err := NewRelayQueries(d, "outbox_event", nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(string(d), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkSQL, sinkArgs = q.MarkSent("relay-1", benchIDs)
			}
		})
	}
	q, _ := NewRelayQueries(Postgres, "outbox_event", nil)
	a := q.ArrayIDs()
	b.Run("postgres-array", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkSQL, sinkArgs = a.MarkSent("relay-1", benchIDs)
		}
	})
}

func BenchmarkMarkRetry(b *testing.B) {
	for _, d := range All {
		q, err := NewRelayQueries(d, "outbox_event", nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(string(d), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkSQL, sinkArgs = q.MarkRetry("relay-1", 7, "broker down", time.Second, 10)
			}
		})
	}
}

func BenchmarkInsertEvent(b *testing.B) {
	for _, d := range All {
		b.Run(string(d), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkSQL = d.InsertEvent("outbox_event", true)
			}
		})
	}
}

func BenchmarkInboxRecord(b *testing.B) {
	for _, d := range All {
		q, err := NewInboxQueries(d, "outbox_inbox")
		if err != nil {
			b.Fatal(err)
		}
		b.Run(string(d), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkSQL, sinkArgs = q.Record(benchConsumer, benchEventID, benchType, benchKey)
			}
		})
	}
}

func BenchmarkNewRelayQueries(b *testing.B) {
	for _, d := range All {
		b.Run(string(d), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := NewRelayQueries(d, "outbox_event", []string{"AUDIT_LOGGED"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
