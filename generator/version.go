package generator

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// ModulePath is the module outboxgen is built from.
const ModulePath = "github.com/outboxgen/outboxgen"

// DevelVersion is the version generated files name when outboxgen is not
// a release build.
const DevelVersion = "devel"

// Version returns the outboxgen version generated files name in their
// header: the version of the outboxgen module in this binary when it is a
// release (a semantic version tag such as v1.2.3 or v1.3.0-rc.1), else
// DevelVersion. A pseudo-version, "(devel)", a version with build metadata
// (as "+dirty" from a modified work tree) or a replaced module all give
// DevelVersion, so that output committed from a development build is the
// same whoever generates it.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return DevelVersion
	}
	return releaseVersion(bi)
}

// BuildVersion returns the version of the outboxgen module in this binary
// as the build recorded it (a pseudo-version and "+dirty" included), or
// "(devel)": what `outboxgen version` prints.
func BuildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	if m := outboxgenModule(bi); m != nil && m.Version != "" {
		return m.Version
	}
	return "(devel)"
}

// outboxgenModule returns the outboxgen module of bi: the main module when
// outboxgen is built or installed on its own (go install ...@v1.2.3), or a
// dependency when it is built inside another module (go tool outboxgen,
// go run github.com/outboxgen/outboxgen/cmd/outboxgen), whose own version
// says nothing about outboxgen's. A replacement wins over the module it
// replaces.
func outboxgenModule(bi *debug.BuildInfo) *debug.Module {
	if bi.Main.Path == ModulePath {
		return &bi.Main
	}
	for _, m := range bi.Deps {
		if m.Path == ModulePath {
			if m.Replace != nil {
				return m.Replace
			}
			return m
		}
	}
	return nil
}

// releaseVersion is Version for bi.
func releaseVersion(bi *debug.BuildInfo) string {
	m := outboxgenModule(bi)
	if m == nil || m.Path != ModulePath || !isRelease(m.Version) {
		return DevelVersion
	}
	return m.Version
}

// semverRE matches a semantic version with a "v" prefix and without build
// metadata: v1.2.3, v1.3.0-rc.1.
var semverRE = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*)?$`)

// pseudoRE matches a Go pseudo-version (the pattern of
// golang.org/x/mod/module.IsPseudoVersion): vX.0.0-yyyymmddhhmmss-abcdef,
// vX.Y.Z-pre.0.yyyymmddhhmmss-abcdef, vX.Y.Z-0.yyyymmddhhmmss-abcdef.
var pseudoRE = regexp.MustCompile(`^v[0-9]+\.(0\.0-|\d+\.\d+-([^+]*\.)?0\.)\d{14}-[A-Za-z0-9]+(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// isRelease reports whether v names a release: a semantic version tag, not
// a pseudo-version, with no build metadata ("+dirty", "+incompatible").
func isRelease(v string) bool {
	return !strings.Contains(v, "+") && semverRE.MatchString(v) && !pseudoRE.MatchString(v)
}
