package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/outboxgen/outboxgen/generator"
	"github.com/outboxgen/outboxgen/generator/export"
	"github.com/outboxgen/outboxgen/generator/spec"
)

const exportUsage = `usage: outboxgen export asyncapi   [-f events.yaml] [-o FILE [-check]] [-format yaml|json] [-title T] [-api-version V]
       outboxgen export jsonschema [-f events.yaml] -dir DIR [-check] [-base-uri URI] [-v]

asyncapi writes an AsyncAPI 3.0.0 document of the events (stdout without -o);
jsonschema writes one JSON Schema (draft 2020-12) per event payload version
into DIR, named like order_paid.v2.schema.json. Files are written only inside
the Go module of events.yaml (the directory holding its go.mod, or
events.yaml's directory when there is none). -check writes nothing: it
fails with a diff when the files on disk are not what export would write.
`

func cmdExport(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, exportUsage)
		return errUsage
	}
	switch args[0] {
	case "asyncapi":
		return cmdExportAsyncAPI(args[1:], stdout, stderr)
	case "jsonschema":
		return cmdExportJSONSchema(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, exportUsage)
		return nil
	}
	fmt.Fprintf(stderr, "outboxgen export: unknown export %q; use asyncapi or jsonschema\n\n%s", args[0], exportUsage)
	return errUsage
}

func cmdExportAsyncAPI(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("export asyncapi", "export asyncapi [-f events.yaml] [-o FILE [-check]] [-format yaml|json] [-title T] [-api-version V]", stderr)
	file := fl.String("f", defaultSpec, "path of events.yaml")
	out := fl.String("o", "", "write the document to this file, inside the module (default: stdout)")
	format := fl.String("format", "", "yaml or json (default: json for a -o ending in .json, else yaml)")
	title := fl.String("title", "", "info.title (default: the Go package name, and \" events\" unless it ends in event or events)")
	apiVersion := fl.String("api-version", "1.0.0", "info.version: the version of the application's API")
	check := fl.Bool("check", false, "write nothing; fail with a diff when the -o file is not up to date (for CI)")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	if *check && *out == "" {
		fmt.Fprintln(stderr, "outboxgen export asyncapi: -check needs -o FILE, the file to check")
		return errUsage
	}
	f := export.YAML
	switch strings.ToLower(*format) {
	case "":
		if strings.EqualFold(filepath.Ext(*out), ".json") {
			f = export.JSON
		}
	case "yaml", "yml":
	case "json":
		f = export.JSON
	default:
		fmt.Fprintf(stderr, "outboxgen export asyncapi: -format %q: use yaml or json\n", *format)
		return errUsage
	}
	s, err := spec.ParseFile(*file)
	if err != nil {
		return err
	}
	doc, err := export.AsyncAPI(s, export.WithFormat(f), export.WithGeneratorVersion(generator.Version()),
		export.WithTitle(*title), export.WithAPIVersion(*apiVersion))
	if err != nil {
		return fmt.Errorf("outboxgen export asyncapi: %w", err)
	}
	if *out == "" {
		_, err := stdout.Write(doc)
		return err
	}
	root, err := moduleRoot(*file)
	if err != nil {
		return fmt.Errorf("outboxgen export asyncapi: %w", err)
	}
	if err := root.check(*out, "; without -o it writes the document to stdout"); err != nil {
		return fmt.Errorf("outboxgen export asyncapi: %w", err)
	}
	// The path as checked: filepath.Abs cleans "link/.." as text, and
	// writing the raw path would let the kernel follow link out of the
	// module.
	path, err := filepath.Abs(*out)
	if err != nil {
		return fmt.Errorf("outboxgen export asyncapi: %w", err)
	}
	files := []generator.File{{Path: path, Content: doc, Root: root.dir}}
	if *check {
		return checkExport("asyncapi", files, *out, stdout, stderr)
	}
	if _, err := generator.Write(files); err != nil {
		return fmt.Errorf("outboxgen export asyncapi: %w", err)
	}
	return nil
}

// checkExport prints the diff between files and the disk, failing with
// errStale when there is one, or says that what kind wrote is up to date.
func checkExport(kind string, files []generator.File, what string, stdout, stderr io.Writer) error {
	diff, err := generator.Diff(files)
	if err != nil {
		return fmt.Errorf("outboxgen export %s: %w", kind, err)
	}
	if diff != "" {
		fmt.Fprint(stdout, diff)
		fmt.Fprintf(stderr, "outboxgen export %s: %s is out of date; run the same command without -check\n", kind, what)
		return errStale
	}
	fmt.Fprintf(stdout, "%s: up to date\n", what)
	return nil
}

func cmdExportJSONSchema(args []string, stdout, stderr io.Writer) error {
	fl := newFlags("export jsonschema", "export jsonschema [-f events.yaml] -dir DIR [-check] [-base-uri URI] [-v]", stderr)
	file := fl.String("f", defaultSpec, "path of events.yaml")
	dir := fl.String("dir", "", "directory to write the schemas to, inside the module (required)")
	baseURI := fl.String("base-uri", "", `give each schema an "$id": this absolute URI (ending in "/") and the file name`)
	verbose := fl.Bool("v", false, "list the files written and removed")
	check := fl.Bool("check", false, "write nothing; fail with a diff when the schemas in -dir are not up to date (for CI)")
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "outboxgen export jsonschema: -dir is required")
		fl.Usage()
		return errUsage
	}
	s, err := spec.ParseFile(*file)
	if err != nil {
		return err
	}
	opts := []export.Option{export.WithGeneratorVersion(generator.Version())}
	if *baseURI != "" {
		opts = append(opts, export.WithBaseURI(*baseURI))
	}
	schemas, err := export.JSONSchema(s, opts...)
	if err != nil {
		return fmt.Errorf("outboxgen export jsonschema: %w", err)
	}
	root, err := moduleRoot(*file)
	if err != nil {
		return fmt.Errorf("outboxgen export jsonschema: %w", err)
	}
	if err := root.check(*dir, ""); err != nil {
		return fmt.Errorf("outboxgen export jsonschema: %w", err)
	}
	files := make([]generator.File, len(schemas))
	keep := map[string]bool{}
	for i, sch := range schemas {
		files[i] = generator.File{Path: filepath.Join(*dir, sch.Name), Content: sch.Content, Root: root.dir}
		keep[sch.Name] = true
	}
	stale, err := staleSchemas(root, *dir, keep)
	if err != nil {
		return fmt.Errorf("outboxgen export jsonschema: %w", err)
	}
	if *check {
		for _, path := range stale {
			files = append(files, generator.File{Path: path, Delete: true, Root: root.dir})
		}
		return checkExport("jsonschema", files, *dir, stdout, stderr)
	}
	written, err := generator.Write(files)
	if err != nil {
		return fmt.Errorf("outboxgen export jsonschema: %w", err)
	}
	var removed []string
	for _, path := range stale {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("outboxgen export jsonschema: %w", err)
		}
		removed = append(removed, path)
	}
	if *verbose {
		for _, p := range written {
			fmt.Fprintln(stdout, "wrote", p)
		}
		for _, p := range removed {
			fmt.Fprintln(stdout, "removed", p, "(no longer generated)")
		}
		fmt.Fprintf(stdout, "%d %s, %d changed, %d removed\n", len(schemas), plural(len(schemas), "schema", "schemas"), len(written), len(removed))
	}
	return nil
}

// staleSchemas returns the *.schema.json files in dir that an earlier
// export wrote (their "$comment" starts with export.GeneratedComment) and
// that keep does not name: the schemas of events or versions no longer in
// events.yaml, to be removed. A file written by hand, or not a regular
// file, is left alone; one outside root is an error.
func staleSchemas(root exportRoot, dir string, keep map[string]bool) ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.schema.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var stale []string
	for _, path := range paths {
		if keep[filepath.Base(path)] {
			continue
		}
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() || fi.Size() > 16<<20 {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return stale, err
		}
		var head struct {
			Comment string `json:"$comment"`
		}
		if json.NewDecoder(bytes.NewReader(data)).Decode(&head) != nil || !strings.HasPrefix(head.Comment, export.GeneratedComment) {
			continue
		}
		// dir was checked already; the file is a regular one (Lstat),
		// so this holds too unless dir changed since.
		if err := root.check(path, ""); err != nil {
			return stale, err
		}
		stale = append(stale, path)
	}
	return stale, nil
}

// exportRoot is the directory tree export may write in.
type exportRoot struct {
	dir string // absolute, symbolic links resolved
	why string // what it is, for errors
}

// moduleRoot returns the directory tree export may write in: that of the
// Go module holding the spec file (the nearest directory at or above it
// with a go.mod), or the spec file's own directory when it is in no
// module; absolute, with symbolic links resolved.
func moduleRoot(specFile string) (exportRoot, error) {
	abs, err := filepath.Abs(filepath.Dir(specFile))
	if err != nil {
		return exportRoot{}, err
	}
	dir, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return exportRoot{}, fmt.Errorf("the directory of %s: %w", specFile, err)
	}
	for d := dir; ; {
		if fi, err := os.Stat(filepath.Join(d, "go.mod")); err == nil && fi.Mode().IsRegular() {
			return exportRoot{d, "the Go module of " + specFile}, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return exportRoot{dir, "the directory of " + specFile + ", which is in no Go module"}, nil
		}
		d = parent
	}
}

// check returns an error unless path, with symbolic links resolved (those
// of its longest existing prefix), is inside the root. generator.Write
// checks the same again before writing; this check names the module.
func (r exportRoot) check(path, hint string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	existing, rest := abs, ""
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		parent := filepath.Dir(existing)
		if parent == existing {
			break
		}
		rest = filepath.Join(filepath.Base(existing), rest)
		existing = parent
	}
	resolved, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	resolved = filepath.Join(resolved, rest)
	rel, err := filepath.Rel(r.dir, resolved)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		where := path
		if resolved != abs {
			where = fmt.Sprintf("%s (%s, symbolic links resolved)", path, resolved)
		}
		return fmt.Errorf("%s is outside %s (%s): export writes files only there%s", where, r.dir, r.why, hint)
	}
	return nil
}
