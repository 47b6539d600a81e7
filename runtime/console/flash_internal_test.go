package console

import (
	"errors"
	"fmt"
	"testing"

	"github.com/outboxgen/outboxgen/runtime/admin"
)

// TestResultFlash covers the flash texts a test cannot provoke through a
// database at will (rows changing state inside the action's transaction).
func TestResultFlash(t *testing.T) {
	h := &handler{}
	sel := selection{expect: -1}
	for _, tc := range []struct {
		a    action
		res  admin.Result
		err  error
		want string
		kind string
	}{
		{actRequeue, admin.Result{Matched: 12, Changed: 12, FirstID: 40, LastID: 57, Keys: 3}, nil,
			"Requeued 12 FAILED events (ids 40–57, 3 keys) in one transaction.", "ok"},
		{actRequeue, admin.Result{Matched: 1, Changed: 1, FirstID: 4, LastID: 4, Keys: 1, Released: 2}, nil,
			"Requeued 1 FAILED event (id 4, 1 key); 2 events held behind them released in one transaction.", "ok"},
		{actDelete, admin.Result{Matched: 1, Changed: 1, FirstID: 4, LastID: 4, Keys: 1, Released: 1}, nil,
			"Deleted 1 FAILED event (id 4, 1 key); 1 event held behind them released in one transaction.", "ok"},
		{actRequeue, admin.Result{Matched: 3, Changed: 2, FirstID: 1, LastID: 3, Keys: 3}, nil,
			"Requeued 2 FAILED events (ids 1–3, 3 keys) in one transaction. 3 events matched, but 1 event changed state meanwhile (a relay or another operator acted on it) and was left alone.", "warn"},
		{actReplay, admin.Result{Matched: 2, Changed: 2, FirstID: 5, LastID: 6, Keys: 1, RecentlySent: 2}, nil,
			"Replayed 2 SENT events (ids 5–6, 1 key) in one transaction. 2 events sent less than 2m ago: a broker with a duplicate window may drop them.", "warn"},
		{actRequeue, admin.Result{Refused: []admin.Refusal{{Ref: "7", Reason: "row 7 is sent, not failed: to publish it again, replay it"}}}, fmt.Errorf("requeue: %w", admin.ErrRefused),
			"Requeue refused: nothing was changed. 1 event named cannot be requeued now (7: row 7 is sent, not failed: to publish it again, replay it).", "error"},
		{actDelete, admin.Result{}, errors.New("connect to postgres://app:hunter22@db/x failed"),
			"Delete failed; nothing was changed: connect to postgres://app:xxxxx@db/x failed", "error"},
	} {
		fl := h.resultFlash(tc.a, sel, tc.res, tc.err)
		if fl.Text != tc.want || fl.Kind != tc.kind {
			t.Errorf("resultFlash(%s, %+v) =\n %q (%s)\nwant\n %q (%s)", tc.a.name, tc.res, fl.Text, fl.Kind, tc.want, tc.kind)
		}
	}
}
