package runner

import (
	"context"
	"errors"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxgen/outboxgen/runtime/driver"
)

// claimDriver is a driver whose Claim records results apart and then
// fails, as a MySQL claim does when its lease fails after the recording
// committed.
type claimDriver struct {
	driver.Driver
	apart bool
}

func (d claimDriver) Claim(_ context.Context, p driver.ClaimParams) ([]driver.Row, error) {
	p.Result.Recorded = driver.Recorded{Sent: 3, Retried: 2, Failed: []int64{7}}
	p.Result.RecordedApart = d.apart
	return nil, errors.New("lease failed")
}

// TestObservedCountsRecordingApart: a claim that failed after recording its
// results apart still counts them; one that failed in the same commit as
// its recording counts nothing, since nothing of it happened.
func TestObservedCountsRecordingApart(t *testing.T) {
	for _, apart := range []bool{true, false} {
		reader := sdkmetric.NewManualReader()
		c, err := newCounters(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test"))
		if err != nil {
			t.Fatal(err)
		}
		o := observe(claimDriver{apart: apart}, &health{}, c, "relay")
		if _, err := o.Claim(context.Background(), driver.ClaimParams{Record: &driver.Results{}}); err == nil {
			t.Fatal("Claim returned no error")
		}
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if s, ok := m.Data.(metricdata.Sum[int64]); ok {
					for _, dp := range s.DataPoints {
						got[m.Name] += dp.Value
					}
				}
			}
		}
		want := map[string]int64{"outboxgen.relay.sent": 3, "outboxgen.relay.retried": 1, "outboxgen.relay.failed": 1}
		if !apart {
			want = map[string]int64{}
		}
		for _, name := range []string{"outboxgen.relay.sent", "outboxgen.relay.retried", "outboxgen.relay.failed"} {
			if got[name] != want[name] {
				t.Errorf("apart=%v: %s = %d, want %d", apart, name, got[name], want[name])
			}
		}
		if got["outboxgen.database.errors"] != 1 {
			t.Errorf("apart=%v: database errors = %d, want 1", apart, got["outboxgen.database.errors"])
		}
	}
}
