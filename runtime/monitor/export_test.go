package monitor

import (
	"context"
	"time"
)

// Tick runs one scheduled check (what Run does each interval), for tests.
func (m *Monitor) Tick(ctx context.Context) error { return m.tick(ctx) }

// SetClock replaces the monitor's local clock (time.Now), for tests. Call
// it before the monitor is used.
func (m *Monitor) SetClock(now func() time.Time) { m.now = now }
