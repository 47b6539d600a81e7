package monitor

import "context"

// Tick runs one scheduled check (what Run does each interval), for tests.
func (m *Monitor) Tick(ctx context.Context) error { return m.tick(ctx) }
