// Package evolution holds the end-to-end test of an event contract that
// evolves: a service's events.yaml goes from version 1 to version 2 of an
// event while version 1 rows are still in its outbox, `outboxgen check
// -against git:REV` accepts the change only with the version bump and the
// earlier version declared, and the regenerated consumer handles the old and
// the new rows, through the relay, with one handler.
package evolution
