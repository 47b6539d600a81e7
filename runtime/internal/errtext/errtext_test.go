package errtext

import (
	"errors"
	"io/fs"
	"testing"
)

func TestReplace(t *testing.T) {
	if err := Replace(fs.ErrNotExist, fs.ErrNotExist.Error()); err != fs.ErrNotExist {
		t.Errorf("same text: %v, want the error itself", err)
	}
	err := Replace(fs.ErrNotExist, "gone")
	if err.Error() != "gone" || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Replace = %q (Is ErrNotExist: %v)", err, errors.Is(err, fs.ErrNotExist))
	}
}
