package spec

import "testing"

func TestLatestOnly(t *testing.T) {
	src := `version: 1
go: {package: events, out: gen}
sql: {dialects: [postgres]}
events:
  - {name: ORDER_PAID, topic: a, key: id, fields: [{name: id, type: string}]}
  - {name: ORDER_STATUS, topic: b, key: id, fields: [{name: id, type: string}]}
consumers:
  - name: points
    latest_only: [ORDER_STATUS]
    events: [ORDER_PAID, ORDER_STATUS]
  - name: sms
    events: [ORDER_PAID]
`
	s, err := Parse("testdata.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	points, sms := s.Consumers[0], s.Consumers[1]
	paid, status := s.Events[0], s.Events[1]
	if len(points.LatestOnly) != 1 || points.LatestOnly[0] != status {
		t.Fatalf("points.LatestOnly = %v, want [ORDER_STATUS] pointing at its declaration", points.LatestOnly)
	}
	if !points.IsLatestOnly(status) || points.IsLatestOnly(paid) || sms.IsLatestOnly(paid) || sms.LatestOnly != nil {
		t.Error("IsLatestOnly disagrees with latest_only")
	}
}
