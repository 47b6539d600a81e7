package outbox

import (
	"errors"
	"strings"
	"testing"
)

func TestUnknownVersion(t *testing.T) {
	for _, tc := range []struct {
		version, current int
		previous         []int
		want             string
	}{
		{0, 2, nil, "outbox: cannot decode ORDER_PAID payload: payload version 0 is not valid (versions start at 1)"},
		{3, 2, []int{1}, "outbox: cannot decode ORDER_PAID payload: payload version 3 is newer than this build understands (2): regenerate with the producer's events.yaml"},
		{1, 2, nil, "outbox: cannot decode ORDER_PAID payload: payload version 1 is no longer declared (this build decodes version 2): declare version 1 with its fields under previous: in events.yaml, and regenerate"},
		{2, 4, []int{1, 3}, "outbox: cannot decode ORDER_PAID payload: payload version 2 is no longer declared (this build decodes versions 1, 3, 4): declare version 2 with its fields under previous: in events.yaml, and regenerate"},
	} {
		err := UnknownVersion("ORDER_PAID", tc.version, tc.current, tc.previous...)
		if !errors.Is(err, ErrUndecodable) || err.Error() != tc.want {
			t.Errorf("UnknownVersion(%d, %d, %v) = %v\nwant %s", tc.version, tc.current, tc.previous, err, tc.want)
		}
	}
}

func TestUnmarshalPayloadAndUpgradeFailed(t *testing.T) {
	var v struct{ A int }
	if err := UnmarshalPayload("X", []byte(`{"A":1}`), &v); err != nil || v.A != 1 {
		t.Errorf("UnmarshalPayload = %v, %+v", err, v)
	}
	if err := UnmarshalPayload("X", []byte(`{"A":"one"}`), &v); !errors.Is(err, ErrUndecodable) || !strings.Contains(err.Error(), "invalid JSON") {
		t.Errorf("UnmarshalPayload of a wrong shape = %v, want ErrUndecodable", err)
	}
	cause := errors.New("unknown tier")
	err := UpgradeFailed("X", 1, 2, cause)
	if !errors.Is(err, ErrUndecodable) || !errors.Is(err, cause) || err.Error() != "outbox: cannot decode X payload: upgrading payload version 1 to 2: unknown tier" {
		t.Errorf("UpgradeFailed = %v", err)
	}
}
