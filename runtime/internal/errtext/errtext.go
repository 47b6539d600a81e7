// Package errtext gives an error another text while keeping it in the
// chain, for errors.Is and errors.As: redaction (package redact) and the
// one-line poison reasons of package inbox.
package errtext

// Replace returns err when its text is text already, else an error whose
// text is text and whose Unwrap returns err. err must not be nil.
func Replace(err error, text string) error {
	if err.Error() == text {
		return err
	}
	return &replaced{err: err, text: text}
}

type replaced struct {
	err  error
	text string
}

func (e *replaced) Error() string { return e.text }
func (e *replaced) Unwrap() error { return e.err }
