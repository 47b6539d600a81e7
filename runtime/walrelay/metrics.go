package walrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
)

// Instruments of the WAL relay (scope outboxgen/runtime/walrelay), next to
// the polling relay's publish instruments (outboxgen.relay.published,
// .publish.duration, .publish.lag, .publish.failures, .breaker.open), which
// it records too.
const (
	// MetricSlotLagBytes is the WAL the slot retains for the relay:
	// pg_current_wal_lsn() - confirmed_flush_lsn, sampled every
	// StatusInterval by the streaming instance.
	MetricSlotLagBytes = "outboxgen.walrelay.slot.lag_bytes"
	// MetricSlotLagSeconds is the age of the commit of the oldest
	// transaction whose events are not all published or parked (0 when
	// none).
	MetricSlotLagSeconds = "outboxgen.walrelay.slot.lag_seconds"
	// MetricStreaming is 1 while this instance holds the slot.
	MetricStreaming = "outboxgen.walrelay.streaming"
	// MetricParked counts events parked in the outbox table.
	MetricParked = "outboxgen.walrelay.parked"
	// MetricMalformed counts outbox messages that could not be decoded.
	MetricMalformed = "outboxgen.walrelay.malformed"
)

// Scope is the instrumentation scope of the WAL relay's own instruments.
const Scope = telemetry.ScopeName + "/runtime/walrelay"

type metrics struct {
	parkedC, malformedC metric.Int64Counter
	lagBytes            atomic.Int64
	reg                 metric.Registration
}

func newMetrics(mp metric.MeterProvider, r *Relay) (*metrics, error) {
	m := mp.Meter(Scope)
	out := &metrics{lagBytes: atomic.Int64{}}
	out.lagBytes.Store(-1)
	var err error
	if out.parkedC, err = m.Int64Counter(MetricParked, metric.WithUnit("{event}"),
		metric.WithDescription("Events the WAL relay parked in the outbox table (publish kept failing, or their key had unsent rows).")); err != nil {
		return nil, err
	}
	if out.malformedC, err = m.Int64Counter(MetricMalformed, metric.WithUnit("{message}"),
		metric.WithDescription("Logical decoding messages of the outbox's prefix that could not be decoded (logged with their LSN, skipped).")); err != nil {
		return nil, err
	}
	lagB, err := m.Int64ObservableGauge(MetricSlotLagBytes, metric.WithUnit("By"),
		metric.WithDescription("WAL retained by the relay's replication slot: pg_current_wal_lsn() - confirmed_flush_lsn."))
	if err != nil {
		return nil, err
	}
	lagS, err := m.Float64ObservableGauge(MetricSlotLagSeconds, metric.WithUnit("s"),
		metric.WithDescription("Age of the commit of the oldest streamed transaction whose events are not all published or parked."))
	if err != nil {
		return nil, err
	}
	streaming, err := m.Int64ObservableGauge(MetricStreaming,
		metric.WithDescription("1 while this WAL relay instance holds the replication slot, else 0 (a standby)."))
	if err != nil {
		return nil, err
	}
	out.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := r.Status()
		v := int64(0)
		if st.Streaming {
			v = 1
			if b := out.lagBytes.Load(); b >= 0 {
				o.ObserveInt64(lagB, b)
			}
			lag := 0.0
			if !st.OldestUnconfirmed.IsZero() {
				lag = max(time.Since(st.OldestUnconfirmed).Seconds(), 0)
			}
			o.ObserveFloat64(lagS, lag)
		}
		o.ObserveInt64(streaming, v)
		return nil
	}, lagB, lagS, streaming)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (m *metrics) parked(ctx context.Context)    { m.parkedC.Add(context.WithoutCancel(ctx), 1) }
func (m *metrics) malformed(ctx context.Context) { m.malformedC.Add(context.WithoutCancel(ctx), 1) }

// sampleLag reads the slot's retained WAL for the lag gauge.
func (r *Relay) sampleLag(ctx context.Context, _ *session) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := SlotStatus(ctx, r.pool, r.cfg.Slot)
	if err != nil || !s.Exists {
		if err != nil && ctx.Err() == nil {
			r.log.Debug("slot lag not sampled", slog.String("error", telemetry.ErrorText(err)))
		}
		return
	}
	r.met.lagBytes.Store(s.LagBytes)
}

// Querier is what SlotStatus needs: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Slot is a replication slot as PostgreSQL reports it.
type Slot struct {
	// Name is the slot's name.
	Name string
	// Exists is false when there is no such slot (nothing is retained).
	Exists bool
	// Active is true while a relay streams from it, or creates it
	// (Creating).
	Active bool
	// LagBytes is the WAL the slot retains: pg_current_wal_lsn() -
	// confirmed_flush_lsn.
	LagBytes int64
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved (about to lose WAL: max_slot_wal_keep_size) or lost (the
	// slot is unusable; events were lost from the stream).
	WALStatus string
	// SafeWALSize is the WAL that may still be written before the slot
	// loses WAL (max_slot_wal_keep_size); -1 when unlimited.
	SafeWALSize int64
	// ConfirmedFlush is the slot's confirmed_flush_lsn.
	ConfirmedFlush string
	// Creating is true while the logical slot is being created:
	// PostgreSQL lists it, held by its creator (Active), from the start of
	// its creation, and sets its confirmed position only once the
	// transactions running at that start have ended. Events committed
	// before then may never be streamed, so writers must wait for a ready
	// slot (Relay.Setup returns once it is).
	Creating bool
}

// SlotStatus reads the replication slot named slot, for `outboxgen status`
// and monitoring.
func SlotStatus(ctx context.Context, q Querier, slot string) (Slot, error) {
	s := Slot{Name: slot, SafeWALSize: -1}
	var safe *int64
	// A physical slot never has a confirmed position: it is not being
	// created (Relay.Setup refuses it).
	err := q.QueryRow(ctx, `SELECT active, coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::int8, 0),
	coalesce(wal_status, ''), safe_wal_size, coalesce(confirmed_flush_lsn::text, ''),
	slot_type = 'logical' AND confirmed_flush_lsn IS NULL
FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s.Active, &s.LagBytes, &s.WALStatus, &safe, &s.ConfirmedFlush, &s.Creating)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return Slot{}, fmt.Errorf("walrelay: read replication slot %s: %w", slot, err)
	}
	s.Exists = true
	if safe != nil {
		s.SafeWALSize = *safe
	}
	return s, nil
}

// CheckSlot is a monitor-style check of the slot: it returns nil when all
// is well, or an error saying what is wrong and what to do: the slot is
// missing, still being created (events committed now may not be
// streamed), not streamed from (no relay holds it, so WAL accumulates),
// lost or about to lose WAL, or retains more than maxLagBytes (0: no
// limit).
func CheckSlot(ctx context.Context, q Querier, slot string, maxLagBytes int64) error {
	s, err := SlotStatus(ctx, q, slot)
	if err != nil {
		return err
	}
	var errs []error
	switch {
	case !s.Exists:
		return fmt.Errorf("walrelay: replication slot %s does not exist: start the WAL relay (it creates the slot); events written meanwhile were not retained", slot)
	case s.WALStatus == "lost":
		errs = append(errs, fmt.Errorf("walrelay: replication slot %s lost WAL (max_slot_wal_keep_size exceeded): events written while the relay was behind are gone from the stream; see the README's recovery steps", slot))
	case s.WALStatus == "unreserved":
		errs = append(errs, fmt.Errorf("walrelay: replication slot %s is about to lose WAL (wal_status unreserved, %d bytes behind): restart the relay or raise max_slot_wal_keep_size", slot, s.LagBytes))
	}
	if s.Creating {
		errs = append(errs, fmt.Errorf("walrelay: replication slot %s is being created (it waits for the transactions running when its creation began to end): events committed before it is ready may not be streamed; check again shortly, and end long-running transactions if it stays", slot))
	}
	if !s.Active {
		errs = append(errs, fmt.Errorf("walrelay: no relay streams from replication slot %s (%d bytes of WAL retained): start the WAL relay", slot, s.LagBytes))
	}
	if maxLagBytes > 0 && s.LagBytes > maxLagBytes {
		errs = append(errs, fmt.Errorf("walrelay: replication slot %s retains %d bytes of WAL, over the %d allowed: the relay is behind or stopped", slot, s.LagBytes, maxLagBytes))
	}
	return errors.Join(errs...)
}
