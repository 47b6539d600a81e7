package main

// Layered settings of the long-running commands (relay, sweep, janitor):
// a flag on the command line wins over the environment variable
// OUTBOXGEN_<FLAG>, which wins over the key <flag> of the -config YAML
// file, which wins over the flag's default. One name everywhere, so a
// Kubernetes manifest can move a setting between args, env and a
// ConfigMap without translation.

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// configFlag is the flag naming the YAML settings file.
const configFlag = "config"

// envName is the environment variable of flag name: OUTBOXGEN_ and the
// name upper-cased with '-' as '_' (batch-size: OUTBOXGEN_BATCH_SIZE).
func envName(name string) string {
	return "OUTBOXGEN_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// parseLayered parses args into fl, then fills every flag the command
// line left alone from its environment variable, then from the config
// file (-config, or $OUTBOXGEN_CONFIG). Command-line mistakes return
// errUsage (exit 2, message printed); a bad environment value or config
// file returns an error naming the variable or the file:line.
func parseLayered(fl *flag.FlagSet, args []string) error {
	if err := parseFlags(fl, args); err != nil {
		return err
	}
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	// Environment first, so that OUTBOXGEN_CONFIG can name the file.
	fl.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if err := fl.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("$%s: %v (it sets -%s)", envName(f.Name), err, f.Name))
			return
		}
		set[f.Name] = true
	})
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	cf := fl.Lookup(configFlag)
	if cf == nil || cf.Value.String() == "" {
		return nil
	}
	return applyConfigFile(fl, cf.Value.String(), set)
}

// applyConfigFile sets the flags not in set from the YAML mapping in
// path (keys are flag names, values scalars).
func applyConfigFile(fl *flag.FlagSet, path string, set map[string]bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-config: %w", err)
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file sets nothing
		}
		return fmt.Errorf("%s: %v", path, err)
	}
	if len(doc.Content) == 0 {
		return nil
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return fmt.Errorf("%s:%d: expected a mapping of flag names to values (batch-size: 200)", path, m.Line)
	}
	var errs []error
	seen := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		name := k.Value
		if prev, dup := seen[name]; dup {
			errs = append(errs, fmt.Errorf("%s:%d: key %q repeats line %d: keep one", path, k.Line, name, prev))
			continue
		}
		seen[name] = k.Line
		f := fl.Lookup(name)
		if f == nil || name == configFlag {
			errs = append(errs, fmt.Errorf("%s:%d: unknown key %q: keys are the flags of `outboxgen %s -h`, without the dash", path, k.Line, name, fl.Name()))
			continue
		}
		if v.Kind != yaml.ScalarNode {
			errs = append(errs, fmt.Errorf("%s:%d: %s: expected a single value, as on the command line", path, v.Line, name))
			continue
		}
		if set[name] {
			continue // the command line or the environment wins
		}
		if err := fl.Set(name, v.Value); err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %s: %v", path, v.Line, name, err))
		}
	}
	return errors.Join(errs...)
}
