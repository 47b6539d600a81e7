package janitor_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/janitor"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakeStore holds counts of removable rows and records every call.
type fakeStore struct {
	mu       sync.Mutex
	sent     int64
	inbox    int64
	calls    []string
	limits   []int
	ages     []time.Duration
	archives []string
	failAt   int // fail the failAt-th call (1-based); 0: never
	ran      chan struct{}
}

func (f *fakeStore) take(what string, pool *int64, olderThan time.Duration, limit int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, what)
	f.limits = append(f.limits, limit)
	f.ages = append(f.ages, olderThan)
	if f.failAt == len(f.calls) {
		return 0, errors.New("boom")
	}
	n := min(int64(limit), *pool)
	*pool -= n
	return n, nil
}

func (f *fakeStore) DeleteSent(_ context.Context, olderThan time.Duration, limit int) (int64, error) {
	return f.take("delete", &f.sent, olderThan, limit)
}

func (f *fakeStore) ArchiveSent(_ context.Context, archive string, olderThan time.Duration, limit int) (int64, error) {
	f.mu.Lock()
	f.archives = append(f.archives, archive)
	f.mu.Unlock()
	return f.take("archive", &f.sent, olderThan, limit)
}

func (f *fakeStore) DeleteInbox(_ context.Context, olderThan time.Duration, limit int) (int64, error) {
	n, err := f.take("inbox", &f.inbox, olderThan, limit)
	if f.ran != nil {
		select {
		case f.ran <- struct{}{}:
		default:
		}
	}
	return n, err
}

func TestNewValidates(t *testing.T) {
	if _, err := janitor.New(nil, janitor.Config{}); err == nil || !strings.Contains(err.Error(), "driver.Driver") {
		t.Errorf("New(nil) error = %v", err)
	}
	for _, o := range []janitor.Config{
		{Interval: -1},
		{Retention: -time.Hour},
		{BatchSize: -1},
		{BatchSize: janitor.MaxBatchSize + 1},
		{ArchiveTable: "Bad Name"},
	} {
		if _, err := janitor.New(&fakeStore{}, o); err == nil || !strings.Contains(err.Error(), "janitor: Config.") {
			t.Errorf("New(%+v) error = %v, want an Config error", o, err)
		}
	}
	j, err := janitor.New(&fakeStore{}, janitor.Config{})
	if err != nil {
		t.Fatal(err)
	}
	o := j.Config()
	if o.Interval != time.Hour || o.Retention != 7*24*time.Hour || o.InboxRetention != 7*24*time.Hour ||
		o.BatchSize != 1000 || o.BatchPause != 100*time.Millisecond || o.Logger == nil {
		t.Errorf("defaults = %+v", o)
	}
}

func TestBatches(t *testing.T) {
	cases := []struct {
		sent, inbox     int64
		wantSentBatches int
		wantInBatches   int
		wantCalls       string
	}{
		{2500, 3, 3, 1, "delete,delete,delete,inbox"},
		{2000, 0, 2, 0, "delete,delete,delete,inbox"}, // a full batch: one more, empty, statement
		{0, 1000, 0, 1, "delete,inbox,inbox"},
		{999, 0, 1, 0, "delete,inbox"},
	}
	for _, c := range cases {
		f := &fakeStore{sent: c.sent, inbox: c.inbox}
		var batches []janitor.Batch
		j, err := janitor.New(f, janitor.Config{Logger: quiet, BatchPause: -1, OnBatch: func(b janitor.Batch) { batches = append(batches, b) }})
		if err != nil {
			t.Fatal(err)
		}
		res, err := j.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		want := janitor.Result{Sent: c.sent, SentBatches: c.wantSentBatches, Inbox: c.inbox, InboxBatches: c.wantInBatches}
		if res != want {
			t.Errorf("%d sent, %d inbox: result %+v, want %+v", c.sent, c.inbox, res, want)
		}
		if got := strings.Join(f.calls, ","); got != c.wantCalls {
			t.Errorf("%d sent, %d inbox: calls %s, want %s", c.sent, c.inbox, got, c.wantCalls)
		}
		if len(batches) != c.wantSentBatches+c.wantInBatches {
			t.Errorf("OnBatch called %d times, want %d", len(batches), c.wantSentBatches+c.wantInBatches)
		}
		for _, l := range f.limits {
			if l != 1000 {
				t.Errorf("limit %d, want BatchSize 1000", l)
			}
		}
	}
}

func TestArchiveAndInboxRetention(t *testing.T) {
	f := &fakeStore{sent: 25, inbox: 5}
	j, err := janitor.New(f, janitor.Config{Logger: quiet, BatchSize: 10, BatchPause: time.Microsecond, ArchiveTable: "outbox_archive",
		Retention: 48 * time.Hour, InboxRetention: -1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := j.RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res != (janitor.Result{Sent: 25, SentBatches: 3, Archived: true}) {
		t.Errorf("result %+v", res)
	}
	if got := strings.Join(f.calls, ","); got != "archive,archive,archive" {
		t.Errorf("calls %s: want three archive batches and no inbox cleanup", got)
	}
	if f.archives[0] != "outbox_archive" || f.ages[0] != 48*time.Hour {
		t.Errorf("archive %q age %s", f.archives[0], f.ages[0])
	}
}

func TestErrorStopsRun(t *testing.T) {
	f := &fakeStore{sent: 2500, inbox: 10, failAt: 2}
	j, err := janitor.New(f, janitor.Config{Logger: quiet, BatchPause: -1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := j.RunOnce(context.Background())
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("error %v, want boom", err)
	}
	if res.Sent != 1000 || res.SentBatches != 1 || res.Inbox != 0 {
		t.Errorf("partial result %+v, want the first batch only", res)
	}
}

func TestCancelDuringPause(t *testing.T) {
	f := &fakeStore{sent: 5000}
	ctx, cancel := context.WithCancel(context.Background())
	j, err := janitor.New(f, janitor.Config{Logger: quiet, BatchPause: time.Hour, OnBatch: func(janitor.Batch) { cancel() }})
	if err != nil {
		t.Fatal(err)
	}
	res, err := j.RunOnce(ctx)
	if !errors.Is(err, context.Canceled) || res.Sent != 1000 {
		t.Fatalf("RunOnce = %+v, %v; want 1000 rows and context.Canceled", res, err)
	}
}

func TestRunCleansUntilCancelled(t *testing.T) {
	f := &fakeStore{sent: 10, ran: make(chan struct{}, 1)}
	j, err := janitor.New(f, janitor.Config{Logger: quiet, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	<-f.ran // first run finished its inbox pass
	<-f.ran // a second, scheduled run
	if err := j.Run(ctx); err == nil {
		t.Error("a second concurrent Run started, want an error")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sent != 0 {
		t.Errorf("%d sent rows left", f.sent)
	}
}
