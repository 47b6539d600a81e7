// Package generator turns a validated events.yaml (package spec) into the
// files outboxgen writes: Go code (package gocode) and SQL DDL (package
// templates), and compares them with what is on disk.
//
// The pipeline is spec → validated model → emitters; nothing here touches a
// database, and nothing in runtime/ is imported.
package generator

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/pmezard/go-difflib/difflib"

	"github.com/outboxgen/outboxgen/generator/gocode"
	"github.com/outboxgen/outboxgen/generator/spec"
	"github.com/outboxgen/outboxgen/templates"
)

// File is one generated file.
type File struct {
	// Path is where the file goes: the spec file's directory joined with
	// the output directory from events.yaml.
	Path    string
	Content []byte
}

// SchemaFileName is the name of the DDL file written for each dialect, in
// <sql.out>/<dialect>/. One directory per dialect lets an sqlc config name
// the directory as its `schema:` next to the application's own DDL.
const SchemaFileName = "outbox.sql"

// Files renders every file s describes, sorted by path. Output directories
// in s are relative to the directory of s.File.
func Files(s *spec.Spec) ([]File, error) {
	base := filepath.Dir(s.File)
	goFiles, err := gocode.Generate(s)
	if err != nil {
		return nil, fmt.Errorf("generate Go code: %w", err)
	}
	var files []File
	for name, src := range goFiles {
		files = append(files, File{Path: filepath.Join(base, s.Go.Out, name), Content: src})
	}
	if s.SQL.Out != "" {
		for _, d := range s.SQL.Dialects {
			ddl, err := Schema(s, d)
			if err != nil {
				return nil, err
			}
			files = append(files, File{Path: filepath.Join(base, s.SQL.Out, string(d), SchemaFileName), Content: ddl})
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return files, nil
}

// Schema renders the DDL of the outbox and inbox tables of s for dialect d.
func Schema(s *spec.Spec, d spec.Dialect) ([]byte, error) {
	ddl, err := templates.Render(string(d), templates.Tables{Outbox: s.SQL.OutboxTable, Inbox: s.SQL.InboxTable, Archive: s.SQL.ArchiveTable})
	if err != nil {
		return nil, fmt.Errorf("render %s schema: %w", d, err)
	}
	return ddl, nil
}

// Write writes files, creating directories as needed. A file whose content
// is already up to date is not touched, so its modification time (and any
// build cache keyed on it) survives a no-op regeneration.
func Write(files []File) (written []string, err error) {
	for _, f := range files {
		old, err := os.ReadFile(f.Path)
		if err == nil && bytes.Equal(old, f.Content) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(f.Path), 0o755); err != nil {
			return written, err
		}
		if err := os.WriteFile(f.Path, f.Content, 0o644); err != nil {
			return written, err
		}
		written = append(written, f.Path)
	}
	return written, nil
}

// Diff compares files with the disk and returns a unified diff of every
// stale or missing file; empty means all generated files are up to date.
func Diff(files []File) (string, error) {
	var out bytes.Buffer
	for _, f := range files {
		old, err := os.ReadFile(f.Path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			old = nil
		case err != nil:
			return "", err
		}
		if bytes.Equal(old, f.Content) {
			continue
		}
		from := f.Path
		if old == nil {
			from = "/dev/null"
		}
		d, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
			A:        difflib.SplitLines(string(old)),
			B:        difflib.SplitLines(string(f.Content)),
			FromFile: from,
			ToFile:   f.Path + " (generated)",
			Context:  3,
		})
		if err != nil {
			return "", err
		}
		out.WriteString(d)
	}
	return out.String(), nil
}
