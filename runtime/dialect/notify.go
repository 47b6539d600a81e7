package dialect

// PostgreSQL LISTEN/NOTIFY: the optional wake-up a writer sends so that
// relays in other processes poll at once instead of at their next
// PollInterval.
//
// NOTIFY is opt-in for writers because of its cost: PostgreSQL serialises
// the commits of all transactions that sent a notification (a global lock
// taken at commit while the notification is queued), which caps the commit
// rate of notifying writers. Use it when sub-poll latency across processes
// matters more than peak write throughput; in-process writers can call the
// relay's Notify instead, for free.

// maxChannel is PostgreSQL's identifier limit (NAMEDATALEN - 1), which
// also bounds a NOTIFY channel name.
const maxChannel = 63

// NotifyChannel returns the LISTEN/NOTIFY channel of outbox table table:
// "<table>_insert", cut to 63 bytes. table must be a ValidIdentifier.
func NotifyChannel(table string) string {
	c := table + "_insert"
	if len(c) > maxChannel {
		c = c[:maxChannel]
	}
	return c
}

// Listen returns the statement that subscribes a PostgreSQL session to the
// channel of outbox table table. table must be a ValidIdentifier.
func Listen(table string) string {
	return mustSpec(Postgres).statements(tables{outbox: table}).get(sListen).static
}

// NotifyInsert returns the statement a writer runs inside its transaction,
// after inserting events into outbox table table, to wake the relays that
// listen on the table's channel. The notification is delivered at commit
// and dropped on rollback, and notifications of one transaction are
// coalesced (the payload is empty), so one call per transaction is enough.
// table must be a ValidIdentifier.
func NotifyInsert(table string) string {
	return mustSpec(Postgres).statements(tables{outbox: table}).get(sNotifyInsert).static
}

// The LISTEN/NOTIFY statements (sql/postgres.sql).
var (
	sNotifyInsert = define(needNotify, "OutboxNotifyInsert")
	sListen       = define(needNotify, "RelayListen")
)
