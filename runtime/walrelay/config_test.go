package walrelay

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

func TestConfigDefaultsAndValidate(t *testing.T) {
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer pub.Close()
	c := Config{Publisher: pub}
	c.setDefaults("outbox_event")
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c.Slot != "outboxgen_outbox_event" || c.Publication != c.Slot || c.QuickRetries != DefaultQuickRetries || c.MaxInFlight != DefaultMaxInFlight ||
		c.MaxInFlightBytes != DefaultMaxInFlightBytes || c.ParkAloneAfter != DefaultParkAloneAfter {
		t.Errorf("defaults: %+v", c)
	}
	bad := c
	bad.Publisher = nil
	bad.Slot = "Bad-Slot"
	bad.MaxInFlight = MaxInFlightLimit + 1
	bad.MaxInFlightBytes = -1
	bad.QuickRetries = -1
	bad.StatusInterval = -1
	bad.ParkAloneAfter = -time.Second
	bad.HedgeAfter = time.Second // without Hedge
	err := bad.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"Publisher is nil", `Slot "Bad-Slot"`, "MaxInFlight is", "MaxInFlightBytes", "QuickRetries", "StatusInterval", "ParkAloneAfter is -1s", "HedgeAfter is 1s but Config.Hedge is false"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	for _, h := range []struct {
		after time.Duration
		want  string
	}{{-time.Second, "HedgeAfter is -1s"}, {c.PublishTimeout, "must be shorter than Config.PublishTimeout"}} {
		hc := c
		hc.Hedge, hc.HedgeAfter = true, h.after
		if err := hc.Validate(); err == nil || !strings.Contains(err.Error(), h.want) {
			t.Errorf("Hedge with HedgeAfter %s: error %v, want one saying %q", h.after, err, h.want)
		}
	}
	hc := c
	hc.Hedge, hc.HedgeAfter = true, 100*time.Millisecond
	if err := hc.Validate(); err != nil {
		t.Errorf("Hedge with HedgeAfter 100ms: %v", err)
	}
}

func TestParkedKeysBound(t *testing.T) {
	p := &parkedKeys{keys: map[string]bool{}, max: 2}
	p.add("a")
	p.add("b")
	if !p.mayHave("a") || p.mayHave("c") || p.checkAll {
		t.Fatalf("under the bound: %+v", p)
	}
	p.remove("a")
	if p.mayHave("a") {
		t.Fatal("removed key still parked")
	}
	p.add("c")
	p.add("d") // 3 > max: every key is checked from now on
	if !p.checkAll || !p.mayHave("zzz") || p.size() != 0 {
		t.Fatalf("over the bound: %+v", p)
	}
}
