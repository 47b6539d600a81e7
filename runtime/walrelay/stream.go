package walrelay

// The stream: one session per START_REPLICATION. A single goroutine (the
// reader) owns the replication connection: it receives the WAL, hands
// each event to the dispatcher (lanes.go), collects the settlements, and
// reports the confirmed position. Nothing else touches the connection.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxgen/outboxgen/runtime/internal/telemetry"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

var pgxNoRows = pgx.ErrNoRows

// txn is one committed transaction of the stream that carried events of
// the outbox, from its BEGIN to the settlement of its last event.
type txn struct {
	end        pglogrepl.LSN // TransactionEndLSN: confirming it skips the transaction on restart
	commitTime time.Time
	events     int  // events it carried
	pending    int  // events not settled yet
	committed  bool // its COMMIT was received
}

// event is one decoded event on its way to the broker.
type event struct {
	outbox.WALEvent
	lsn   pglogrepl.LSN
	tx    *txn
	bytes int // the message content's length (MaxInFlightBytes)
	// pending: its batch call failed or was split, and its own call has
	// not started; it counts among the breaker's publishes under way
	// (breaker.handOver) until then. Read and written by the goroutine
	// that holds the event (the dispatcher's lock hands it over).
	pending bool
	// attempts and failed: its delivery's failed attempts so far and the
	// number of calls started when the first failed (breaker.verdict; 0:
	// none yet), kept while it waits in its lane for the open breaker, so
	// that the evidence against a poison event outlasts an outage. Held
	// as pending is.
	attempts int
	failed   uint64
	// extra: attempts granted beyond QuickRetries (one more after the
	// broker came back; those of a key failing alone). alone: when its
	// key was first found failing alone, and its retries since
	// (Config.ParkAloneAfter). Held as pending is.
	extra      int
	alone      time.Time
	aloneTries int
}

// settlement is one settled event, as the reader accounts for it.
type settlement struct {
	tx    *txn
	bytes int
}

type session struct {
	r    *Relay
	conn *pgconn.PgConn

	settled  chan settlement // one per settled event
	fifo     []*txn          // transactions with events, in commit order
	cur      *txn            // between BEGIN and COMMIT
	curHas   bool            // cur carried an outbox event
	inFlight int             // events not settled
	// 1 + the breaker's epoch of overflow's last warnings: reading on,
	// and at the end of the room (each said once per opening).
	saidReadingOn, saidAtRoomEnd int
	inFlightBytes                int // their content bytes
	// waiting counts the settled events of committed transactions not yet
	// confirmed (behind an unsettled one): with inFlight, what
	// MaxUnconfirmed bounds. Those of the open transaction are left out,
	// so that a transaction with more events than MaxUnconfirmed can
	// still be read to its COMMIT.
	waiting       int
	confirmed     pglogrepl.LSN // everything before it is settled: the next report
	sentConfirmed pglogrepl.LSN // the last position reported to PostgreSQL
	disp          *dispatcher
}

// session connects, sets up, starts streaming and streams until ctx is
// done or the connection fails.
func (r *Relay) session(ctx context.Context, standby *bool) (err error) {
	conn, closeConn, err := r.connectReplication(ctx)
	if err != nil {
		return err
	}
	defer closeConn()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.setup(sctx, conn, false); err != nil {
		return err
	}
	var confirmed pglogrepl.LSN
	if err := r.pool.QueryRow(sctx, "SELECT coalesce(confirmed_flush_lsn, '0/0'::pg_lsn)::text FROM pg_replication_slots WHERE slot_name = $1", r.cfg.Slot).Scan(&confirmed); err != nil {
		return classify("read the slot's confirmed position", err)
	}
	err = pglogrepl.StartReplication(sctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names '" + r.cfg.Publication + "'",
			"messages 'true'",
		},
	})
	if err != nil {
		return classify("start replication from slot "+r.cfg.Slot, err)
	}
	// Holding the slot, load the keys with unsent rows: their events go to
	// the table until those rows are sent.
	parked, err := r.loadParked(sctx)
	if err != nil {
		return classify("load the keys parked in "+r.table, err)
	}
	cancel()
	*standby = false
	r.log.Info("streaming", slog.String("from", confirmed.String()), slog.Int("parked_keys", parked.size()), slog.Bool("check_every_key", parked.checkAll))
	r.mu.Lock()
	r.slotSeen = true
	r.status.Streaming, r.status.Confirmed = true, confirmed
	r.mu.Unlock()
	defer r.update(func(s *Status) {
		s.Streaming = false
		s.InFlight = 0
		s.Unconfirmed = 0
		s.OldestUnconfirmed = time.Time{}
	})

	s := &session{
		r: r, conn: conn,
		// Room for every event in flight (twice MaxInFlight at most, see
		// overflow), so that a worker never waits for the reader to settle.
		settled:   make(chan settlement, 2*r.cfg.MaxInFlight+1),
		confirmed: confirmed, sentConfirmed: confirmed,
	}
	s.disp = newDispatcher(r, parked, s.settled)
	err = s.stream(ctx)
	if isFatal(err) && !s.disp.hasFailed() {
		// Stopped at an unreadable message: let the events read before
		// it settle, so that the confirmed position reaches it.
		s.finish(ctx, r.cfg.ShutdownTimeout)
	}
	// Shutdown or a broken connection: stop starting publishes, wait for
	// those under way (ShutdownTimeout), confirm what was settled.
	s.disp.stop(r.cfg.ShutdownTimeout)
	s.drain()
	if s.disp.hasFailed() && !errors.Is(err, s.disp.err) {
		// A park that cannot succeed, beside the error that ended the
		// stream: it needs the operator too, and says what to do.
		r.log.Error("an event could not be parked either", slog.String("error", telemetry.ErrorText(s.disp.err)))
		err = errors.Join(err, s.disp.err)
	}
	// A fatal error of the stream (an unreadable message) leaves the
	// connection working: report what was settled before it.
	if err == nil || ctx.Err() != nil || isFatal(err) {
		if ferr := s.report(); ferr != nil {
			r.log.Warn("could not report the final confirmed position; the events after the last reported one will be published again", slog.String("error", telemetry.ErrorText(ferr)))
		} else {
			r.log.Info("stream stopped", slog.String("confirmed", s.confirmed.String()))
		}
	}
	return err
}

// stream is the reader loop.
func (s *session) stream(ctx context.Context) error {
	r := s.r
	stopWatch := context.AfterFunc(ctx, func() { _ = s.conn.Conn().SetReadDeadline(time.Now()) })
	defer stopWatch()
	defer func() { _ = s.conn.Conn().SetReadDeadline(time.Time{}) }()
	statusDue := time.Now().Add(r.cfg.StatusInterval)
	wait := time.NewTimer(time.Hour)
	defer wait.Stop()
	for {
		if ctx.Err() != nil {
			return nil
		}
		s.drain()
		if now := time.Now(); !now.Before(statusDue) {
			if err := s.report(); err != nil {
				return fmt.Errorf("walrelay: send standby status: %w", err)
			}
			r.sampleLag(ctx, s)
			statusDue = now.Add(r.cfg.StatusInterval)
		}
		if s.disp.hasFailed() {
			return s.disp.err
		}
		if s.full() && !s.overflow() {
			// Backpressure: stop reading until events settle and their
			// transactions are confirmed.
			wait.Reset(time.Until(statusDue))
			select {
			case <-ctx.Done():
			case t := <-s.settled:
				s.settle(t)
			case <-s.disp.failed:
			case <-s.disp.starve:
			case <-wait.C:
			}
			if !wait.Stop() {
				select {
				case <-wait.C:
				default:
				}
			}
			continue
		}
		// A read deadline on the socket, not a context: a context per
		// message costs pgconn a watcher goroutine per message. The
		// deadline (the next status report) bounds the wait; shutdown
		// interrupts it (interrupt).
		_ = s.conn.Conn().SetReadDeadline(statusDue)
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("walrelay: receive from the replication stream: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handle(ctx, m.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("walrelay: replication stream: %w", pgconn.ErrorResponseToPgError(m))
		}
	}
}

// handle processes one CopyData message of the stream.
func (s *session) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("walrelay: parse keepalive: %w", err)
		}
		// Every transaction that committed before ServerWALEnd was sent:
		// with nothing unsettled, it is all done, and confirming it lets
		// PostgreSQL recycle the WAL of other databases and of
		// transactions without events. One still open there is not lost:
		// decoding skips only transactions whose commit record starts
		// before the confirmed position, and its commit comes later.
		if len(s.fifo) == 0 && s.cur == nil && k.ServerWALEnd > s.confirmed {
			s.confirmed = k.ServerWALEnd
		}
		if k.ReplyRequested {
			return s.report()
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("walrelay: parse XLogData: %w", err)
		}
		return s.logical(ctx, x)
	}
	return nil
}

// logical processes one pgoutput message.
func (s *session) logical(ctx context.Context, x pglogrepl.XLogData) error {
	msg, err := pglogrepl.Parse(x.WALData)
	if err != nil {
		// A pgoutput message this build does not parse (not one the relay
		// asked for): skip it.
		s.r.log.Debug("pgoutput message skipped", slog.String("lsn", x.WALStart.String()), slog.String("error", err.Error()))
		return nil
	}
	switch m := msg.(type) {
	case *pglogrepl.BeginMessage:
		s.cur = &txn{commitTime: m.CommitTime}
		s.curHas = false
	case *pglogrepl.CommitMessage:
		if s.cur == nil {
			return nil
		}
		s.cur.end = m.TransactionEndLSN
		s.cur.committed = true
		if s.curHas {
			s.waiting += s.cur.events - s.cur.pending
		}
		if !s.curHas && len(s.fifo) == 0 && m.TransactionEndLSN > s.confirmed {
			s.confirmed = m.TransactionEndLSN
		}
		s.cur = nil
		s.advance()
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix != s.r.prefix {
			return nil
		}
		if !m.Transactional || s.cur == nil {
			s.r.malformed(ctx, m.LSN, len(m.Content), errors.New("a non-transactional message: written with pg_logical_emit_message(false, ...), it is not tied to a commit and is skipped"))
			return nil
		}
		ev, err := outbox.DecodeWALEvent(m.Content, s.r.cfg.MaxMessageBytes)
		if errors.Is(err, outbox.ErrWALMessageTooLarge) || errors.Is(err, outbox.ErrWALEnvelopeVersion) {
			return s.r.unreadable(m.LSN, len(m.Content), err)
		}
		if err != nil {
			// Content no build can read (a known version that breaks its
			// format): stopping would stall the stream for good, and no
			// relay could ever publish it; logged with its LSN and skipped.
			s.r.malformed(ctx, m.LSN, len(m.Content), err)
			return nil
		}
		if !s.curHas {
			s.curHas = true
			s.fifo = append(s.fifo, s.cur)
		}
		s.cur.events++
		s.cur.pending++
		s.inFlight++
		s.inFlightBytes += len(m.Content)
		// The content slice belongs to the connection's buffer: copy.
		ev.Payload = append([]byte(nil), ev.Payload...)
		ev.Headers = append([]byte(nil), ev.Headers...)
		if len(ev.Headers) == 0 {
			ev.Headers = nil
		}
		s.disp.dispatch(&event{WALEvent: ev, lsn: m.LSN, tx: s.cur, bytes: len(m.Content)})
	}
	return nil
}

// finish waits, at most timeout or until ctx ends, for every event
// dispatched to settle.
func (s *session) finish(ctx context.Context, timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for s.inFlight > 0 {
		select {
		case tx := <-s.settled:
			s.settle(tx)
		case <-s.disp.failed:
			return // an event that can never settle: waiting is for nothing
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// drain takes every settlement waiting.
func (s *session) drain() {
	for {
		select {
		case t := <-s.settled:
			s.settle(t)
		default:
			s.advance()
			return
		}
	}
}

func (s *session) settle(st settlement) {
	st.tx.pending--
	if st.tx.committed {
		s.waiting++
	}
	s.inFlight--
	s.inFlightBytes -= st.bytes
}

// full reports whether the reader must pause: MaxInFlight events not
// settled, MaxUnconfirmed not confirmed, or MaxInFlightBytes of content
// not settled (at least one event is always admitted, so a single large
// one cannot wedge the stream). Settled events count only toward
// MaxUnconfirmed: they hold no content, and counting them toward
// MaxInFlight would let one slow event pause every key once MaxInFlight
// events of other keys had been published behind it.
func (s *session) full() bool { return s.atBounds(1) }

// atBounds reports whether the reader is at its bounds stretched times
// over: times MaxInFlight, MaxUnconfirmed and (times-1) MaxInFlight more,
// times MaxInFlightBytes (see overflow for times 2).
func (s *session) atBounds(times int) bool {
	cfg := s.r.cfg
	return s.inFlight >= times*cfg.MaxInFlight ||
		s.inFlight+s.waiting >= cfg.MaxUnconfirmed+(times-1)*cfg.MaxInFlight ||
		s.inFlight > 0 && s.inFlightBytes >= times*cfg.MaxInFlightBytes
}

// overflow reports whether the reader reads on past its bounds (full),
// up to twice each: while the dispatcher is starved (the breaker is open
// and every key in flight failed since it opened), a key read next can
// probe. Poison events of a few keys, with their keys' later events
// behind them, would otherwise hold the breaker open and the stream for
// good; in an outage the extra events fail in turn, one new key at a
// time, and the reader stops at twice the bounds.
func (s *session) overflow() bool {
	if !s.disp.starved() {
		return false
	}
	cfg := s.r.cfg
	room := !s.atBounds(2)
	// Each said once per opening of the breaker.
	epoch, _ := s.disp.brk.openEpoch()
	switch {
	case room && s.saidReadingOn != epoch+1:
		s.saidReadingOn = epoch + 1
		s.r.log.Warn("circuit breaker open, and every key in flight has failed since it opened: reading on past the in-flight bounds (up to twice them) so that another key's event can probe; poison events of those keys are parked once a probe succeeds",
			slog.Int("in_flight", s.inFlight), slog.Int("max_in_flight", cfg.MaxInFlight))
	case !room && s.saidAtRoomEnd != epoch+1:
		s.saidAtRoomEnd = epoch + 1
		s.r.log.Warn("circuit breaker open, and every key in flight, twice the in-flight bounds, has failed since it opened: the stream waits for the broker (an outage, or poison events of every key read)",
			slog.Int("in_flight", s.inFlight), slog.Int("max_in_flight", cfg.MaxInFlight))
	}
	return room
}

// advance moves the confirmed position over the leading transactions whose
// events are all settled.
func (s *session) advance() {
	for len(s.fifo) > 0 {
		t := s.fifo[0]
		if !t.committed || t.pending > 0 {
			break
		}
		if t.end > s.confirmed {
			s.confirmed = t.end
		}
		s.waiting -= t.events
		s.fifo[0] = nil
		s.fifo = s.fifo[1:]
	}
	oldest := time.Time{}
	if len(s.fifo) > 0 {
		oldest = s.fifo[0].commitTime
	}
	n, u := s.inFlight, s.inFlight+s.waiting
	c := s.confirmed
	s.r.update(func(st *Status) { st.Confirmed = c; st.InFlight = n; st.Unconfirmed = u; st.OldestUnconfirmed = oldest })
}

// report sends the confirmed position as written, flushed and applied.
func (s *session) report() error {
	s.advance()
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.confirmed, WALFlushPosition: s.confirmed, WALApplyPosition: s.confirmed,
	})
	if err == nil {
		s.sentConfirmed = s.confirmed
	}
	return err
}

// unreadable is the error that stops Run at a message of the outbox's
// prefix that may be a valid event this relay cannot read: larger than
// MaxMessageBytes, or of a newer envelope version. Skipping it would drop
// a committed event; its transaction is still open in the stream (cur),
// so the confirmed position stays before it and the next relay reads it
// again.
func (r *Relay) unreadable(lsn pglogrepl.LSN, size int, err error) error {
	todo := "upgrade the relay (outboxgen) to the version of the writers, then start it again; if no writer writes that version (the message is not an event), move the slot past it by hand with pg_replication_slot_advance to its transaction's end, which also skips that transaction's other events"
	if errors.Is(err, outbox.ErrWALMessageTooLarge) {
		todo = fmt.Sprintf("raise Config.MaxMessageBytes (outboxgen relay: -wal-max-message-bytes) to at least %d bytes (the writers' WithMaxMessageSize plus 64 KiB covers any event they write), then start the relay again", size)
	}
	return fatalError{fmt.Errorf("walrelay: the outbox WAL message at LSN %s cannot be read by this relay (%w): it was not skipped, and the slot stays before it: %s", lsn, err, todo)}
}

// malformed logs a message of the outbox's prefix that cannot be
// published, with its position, and counts it.
func (r *Relay) malformed(ctx context.Context, lsn pglogrepl.LSN, size int, err error) {
	r.log.ErrorContext(ctx, "outbox WAL message cannot be decoded: skipped (it cannot be published); inspect it with pg_logical_slot_peek_binary_changes or pg_waldump at this position",
		slog.String("lsn", lsn.String()), slog.Int("bytes", size), slog.String("error", err.Error()))
	r.update(func(s *Status) { s.Malformed++ })
	r.met.malformed(ctx)
	if r.cfg.OnMalformed != nil {
		r.cfg.OnMalformed(Malformed{LSN: lsn.String(), Size: size, Error: err})
	}
}
