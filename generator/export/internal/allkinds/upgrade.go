package allkinds

import (
	"encoding/json"
	"strconv"
)

// The upgrades generated code requires for the previous versions of
// ORDER_PAID declared in allkinds.yaml (hand-written, as a service writes
// them).

// UpgradeOrderPaidV1 turns cents into a decimal amount; v1 had no
// currency, and every v1 order was in euros.
func UpgradeOrderPaidV1(v OrderPaidV1) (OrderPaidV2, error) {
	sign, cents := "", v.AmountCents
	if cents < 0 {
		sign, cents = "-", -cents
	}
	frac := strconv.FormatInt(cents%100, 10)
	if len(frac) == 1 {
		frac = "0" + frac
	}
	return OrderPaidV2{
		OrderID:  v.OrderID,
		Amount:   json.Number(sign + strconv.FormatInt(cents/100, 10) + "." + frac),
		Currency: "EUR",
	}, nil
}

// UpgradeOrderPaidV2 moves amount and currency into total; v2 had no
// payment time.
func UpgradeOrderPaidV2(v OrderPaidV2) (OrderPaid, error) {
	return OrderPaid{
		OrderID: v.OrderID,
		Total:   Money{Amount: v.Amount, Currency: v.Currency},
	}, nil
}
